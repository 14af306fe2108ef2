"""The bot's Russian texts. Adding a language is adding a file like this one: its `NAME`, shown in
the language picker, and a text for every id of the English file, with the same placeholders."""

from __future__ import annotations

NAME = "Русский"

TEXTS: dict[str, str] = {
    # The command menu Telegram shows next to the input field.
    "command_start": "Меню",
    "command_buy": "Купить токены",
    "command_key": "Мои API-ключи",
    "command_balance": "Баланс и расход",
    "command_paysupport": "Платежи, возвраты и поддержка",
    "command_terms": "Условия использования",
    "command_privacy": "Политика конфиденциальности",
    "command_help": "Помощь",
    # The menu (a persistent reply keyboard); the labels are also what the buttons send.
    "button_buy": "🛒 Купить токены",
    "button_key": "🔑 Мой ключ",
    "button_balance": "💰 Баланс",
    "button_help": "❓ Помощь",
    "welcome": (
        "Привет, {name}! Этот бот продаёт доступ к API, совместимому с OpenAI.\n"
        "\n"
        "Купите пакет токенов за Telegram Stars, и API-ключ будет готов сразу: в любом "
        "клиенте OpenAI поменяйте только <code>base_url</code> и <code>api_key</code>.\n"
        "\n"
        "Пользуйтесь меню ниже."
    ),
    "help": (
        "<b>Как это работает</b>\n"
        "1. 🛒 Купить токены: выберите пакет и оплатите Telegram Stars.\n"
        "2. 🔑 Мой ключ: ваши API-ключи и готовый пример.\n"
        "3. Запрос стоит токены запроса, умноженные на цену запроса модели, плюс "
        "токены ответа, умноженные на цену ответа (по 1, если оператор не задал других "
        "цен), с округлением вверх.\n"
        "\n"
        "/balance — остаток и расход по дням и моделям\n"
        "/key — ваши API-ключи\n"
        "/buy — пакеты токенов\n"
        "/plan — ваш тариф на месяц: продление, отмена, возобновление\n"
        "/paysupport — платежи, возвраты и сообщение в поддержку\n"
        "/promo — активировать промокод\n"
        "/invite — ваша ссылка-приглашение\n"
        "/language — язык бота\n"
        "/terms — условия использования\n"
        "/privacy — политика конфиденциальности"
    ),
    "unknown_command": "Я не знаю такой команды. Отправьте /help, чтобы увидеть, что я умею.",
    "apology": "Извините, у нас что-то пошло не так. Попробуйте ещё раз через минуту.",
    # Terms, accepted with one tap before the first purchase.
    "terms_prompt": (
        "Перед первой покупкой примите, пожалуйста, условия:\n"
        "\n"
        "• Токены — это предоплаченный баланс для запросов к API; они не сгорают.\n"
        "• Платёж возвращается целиком или никак: в течение {days} дней, пока токены "
        "пакета не израсходованы (доступный баланс покрывает пакет).\n"
        "• Храните API-ключи в секрете; их можно заменить или отозвать в любой момент.\n"
        "\n"
        "Полный текст: /terms · Конфиденциальность: /privacy"
    ),
    "button_accept_terms": "✅ Принимаю",
    "terms": (
        "<b>Условия использования</b>\n"
        "\n"
        "1. Вы покупаете предоплаченные токены для API генерации текста, совместимого "
        "с OpenAI. Запрос стоит токены запроса, умноженные на цену запроса модели, "
        "плюс токены ответа, умноженные на цену ответа, с округлением вверх; цена "
        "равна 1, если оператор не задал другую.\n"
        "2. Оплата — в Telegram Stars. Токены зачисляются после успешной оплаты и не "
        "сгорают. Платёж, который нельзя зачислить, сразу возвращается.\n"
        "3. Возвраты: Telegram возвращает платёж целиком или никак. В течение {days} "
        "дней после покупки, пока её токены не израсходованы (доступный баланс "
        "покрывает пакет), напишите через /paysupport — платёж вернут, а токены пакета "
        "спишут. В остальных случаях решает оператор.\n"
        "4. API-ключи личные. Не передавайте их; при утечке замените или отзовите ключ "
        "в 🔑 Мой ключ.\n"
        "5. Сервис предоставляется как есть; сгенерированный текст может быть неверным."
    ),
    "privacy": (
        "<b>Политика конфиденциальности</b>\n"
        "\n"
        "Мы храним ваш Telegram id, имя и язык, ваши платежи и расход токенов (время, "
        "модель, число токенов). Тексты запросов и ответов мы не храним. Ваш API-ключ "
        "тоже не хранится: только его хеш. Сообщения в поддержку и ответы на них "
        "хранятся вместе с вашим аккаунтом.\n"
        "Чтобы удалить ваши данные, напишите через /paysupport."
    ),
    # Buying.
    "packs": "Выберите пакет. Оплата в Telegram Stars ⭐.",
    "pack_button": "{title} · {tokens} токенов · {price} ⭐",
    "invoice_title": "{title}: {tokens} токенов",
    "invoice_description": (
        "{tokens} токенов для API, совместимого с OpenAI. Зачисляются сразу после оплаты."
    ),
    "invoice_label": "{tokens} токенов",
    "payment_received": "✅ Оплата получена: +{tokens} токенов.\nДоступно: {available} токенов.",
    "payment_first_key": "🔑 Вот ваш API-ключ. Он также доступен в 🔑 Мой ключ.\n\n{snippet}",
    "snippet": (
        "API-ключ: <code>{key}</code>\n"
        "Base URL: <code>{base_url}</code>\n"
        "\n"
        "<b>curl</b>\n"
        "{curl}\n"
        "\n"
        "<b>Python (openai)</b>\n"
        "{python}"
    ),
    # Pre-checkout refusals (Telegram shows them in the payment form).
    "order_unknown": "Этот счёт не найден. Выберите пакет ещё раз.",
    "order_someone_else": "Этот счёт выставлен другому пользователю.",
    "order_paid": "Этот счёт уже оплачен.",
    "order_expired": "Срок действия счёта истёк. Выберите пакет ещё раз.",
    "order_price": "Цена изменилась. Выберите пакет ещё раз.",
    "order_generic": "Этот счёт нельзя оплатить. Выберите пакет ещё раз.",
    "pack_unknown": "Этот пакет больше не продаётся. Вот актуальные.",
    # My key.
    "key_none": "API-ключ выдаётся с первым пакетом. Выберите пакет:",
    "key_show": (
        "🔑 <b>{name}</b>: <code>{masked}</code>\n"
        "Нажмите, чтобы показать: <tg-spoiler>{key}</tg-spoiler>\n"
        "\n"
        "Base URL: <code>{base_url}</code>"
    ),
    "button_snippet": "📋 Пример подключения",
    "button_rotate": "♻️ Заменить",
    "rotate_confirm": (
        "Заменить ключ «{name}»? Он сразу перестанет работать, и во всех программах, "
        "где он используется, понадобится новый."
    ),
    "button_rotate_yes": "Да, заменить",
    "button_cancel": "Отмена",
    "rotated": ("♻️ Готово. Старый ключ «{name}» больше не работает. Новый:\n\n{snippet}"),
    # Balance.
    "balance": (
        "💰 <b>Доступно: {available} токенов</b>\n"
        "Занято выполняющимися запросами: {held}\n"
        "Куплено: {purchased} · Начислено: {granted}\n"
        "Израсходовано: {used} · Возвращено: {refunded}"
    ),
    "balance_no_history": "\nЗапросов пока не было.",
    "balance_empty_hint": ("\nБаланс пуст: 🛒 купите токены, чтобы продолжить."),
    # Support.
    "paysupport": (
        "<b>Платежи и возвраты</b>\n"
        "{purchases}\n"
        "\n"
        "Telegram возвращает платёж целиком или никак. В течение {days} дней после "
        "покупки, пока её токены не израсходованы, платёж вернут по запросу. Чтобы "
        "написать операторам, просто отправьте сообщение следующим (укажите "
        "идентификатор платежа); оно дойдёт до них как есть.{contact}"
    ),
    "paysupport_none": "Платежей пока нет.",
    "paysupport_line": "{time} · {pack} · {price} ⭐ · <code>{charge_id}</code>{refunded}",
    "paysupport_refunded": " · возвращён",
    # Refunds and grants, as the buyer sees them.
    "refunded": "↩️ Платёж за {pack} ({price} ⭐) возвращён; списано {tokens} токенов.",
    "granted": "🎁 Вам начислено {tokens} токенов. API-ключ — в 🔑 Мой ключ.",
    # Notices, sent once per crossing by a job.
    "notice_low": "⚠️ Баланс на исходе: осталось {available} токенов. 🛒 Пополните его.",
    "notice_empty": (
        "⛔️ Токены закончились; запросы к API отклоняются, пока вы не пополните баланс."
    ),
    # Operators.
    "stats": "📊 <b>Сегодня</b> (UTC)\n{today}\n\n<b>За всё время</b>\n{total}",
    "stats_block": (
        "Покупателей: {buyers} · Покупок: {purchases}\n"
        "Выручка: {revenue} ⭐ (возвращено {refunded} ⭐)\n"
        "Токенов продано: {sold} · начислено: {granted} · израсходовано: {used}"
    ),
    "refund_usage": "Использование: /refund &lt;charge_id&gt;",
    "refund_unknown": "Нет покупки с идентификатором <code>{charge_id}</code>.",
    "refund_already": "Платёж <code>{charge_id}</code> уже возвращён.",
    "refund_telegram_failed": "Telegram отклонил возврат ({error}). Ничего не изменено.",
    "refund_done": (
        "Возвращено {price} ⭐ за <code>{charge_id}</code>: списано {tokens} токенов{shortfall}."
    ),
    "refund_shortfall": ", {tokens} уже были израсходованы",
    "grant_usage": "Использование: /grant &lt;telegram_id&gt; &lt;tokens&gt;",
    "grant_no_account": "Пользователь Telegram {telegram_id} ещё не запускал бота.",
    "grant_done": "Начислено {tokens} токенов пользователю {telegram_id}. Доступно: {available}.",
    "invalid_amount": "Количество должно быть целым положительным числом токенов.",
    "operator_alert": "⚠️ <b>Платёж требует внимания</b>\n{items}",
    "reconcile_report": "🧾 <b>Транзакции Stars и покупки</b>\n{items}",
    "command_promo": "Активировать промокод",
    "command_invite": "Пригласить друзей",
    "command_language": "Язык",
    "button_support": "💬 Поддержка",
    "key_usage": ("\n<b>Этот ключ</b>: запросов {requests}, списано {tokens} токенов"),
    "usage_line": (
        "{day} · {model} · {requests} запр. · запрос {prompt} · ответ {completion} · "
        "списано {charged}"
    ),
    "usage_title": ("\n<b>Расход по дням и моделям</b> (UTC, страница {page})"),
    "usage_csv": "Все оплаченные запросы в CSV.",
    "keys_title": "🔑 <b>Ваши API-ключи</b>",
    "keys_line": (
        "• <b>{name}</b> · <code>{masked}</code> · запросов {requests} · токенов {tokens}"
    ),
    "keys_empty": "Действующих ключей нет. Создайте новый кнопкой ниже.",
    "keys_too_many": "У вас уже {limit} действующих ключей; сначала отзовите один.",
    "key_created": "➕ Новый ключ создан.\n",
    "key_default_name": "ключ {number}",
    "key_gone": "Этого ключа больше нет.",
    "key_unchanged": "Ключ не изменён.",
    "button_rename": "✏️ Переименовать",
    "button_revoke": "🗑 Отозвать",
    "button_new_key": "➕ Новый ключ",
    "button_all_keys": "« Все ключи",
    "revoke_confirm": (
        "Отозвать ключ «{name}»? Он сразу перестанет работать и не будет заменён; "
        "остальные ключи продолжат работать."
    ),
    "button_revoke_yes": "Да, отозвать",
    "revoked": "🗑 Ключ «{name}» отозван.\n",
    "renamed": "✏️ Теперь ключ называется «{name}».",
    "rename_prompt": "✏️ Новое имя для ключа «{name}» (#{id}): ответьте на это сообщение.",
    "button_limits": "🚦 Лимиты",
    "key_limits": "\n🚦 <b>Лимиты</b>: {limits}",
    "key_limits_none": "\n🚦 <b>Лимиты</b>: нет; ключ может тратить весь баланс.",
    "limit_spend": "потрачено {spent} из {limit} токенов за {period} (сброс {resets})",
    "limit_spend_total": "потрачено {spent} из {limit} токенов всего",
    "period_daily": "день",
    "period_weekly": "неделю",
    "period_monthly": "месяц",
    "limit_expires": "действует до {when}",
    "limit_models": "модели {models}",
    "limit_rpm": "{rpm} запросов в минуту",
    "limit_tpm": "{tpm} токенов в минуту",
    "limits_prompt": (
        "🚦 Лимиты ключа «{name}» (#{id}): ответьте на это сообщение, что изменить, "
        "например:\nspend 5000 daily; rpm 60; tpm 20000; models demo; expires 2027-01-31\n"
        "Периоды: daily, weekly, monthly (UTC) или total. «rpm off» снимает один лимит, "
        "«clear» — все."
    ),
    "limits_set": "🚦 Лимиты ключа «{name}» заданы; все серверы применят их за несколько секунд.",
    "limits_invalid": "🚦 Ничего не изменено: {error}",
    "key_alert_80": (
        "⚠️ Ключ «{name}» (…{hint}) потратил {spent} из {limit} токенов за {period}: 80% "
        "лимита. Сброс {resets}."
    ),
    "key_alert_80_total": (
        "⚠️ Ключ «{name}» (…{hint}) потратил {spent} из {limit} токенов: 80% лимита."
    ),
    "key_alert_100": (
        "⛔ Ключ «{name}» (…{hint}) исчерпал лимит в {limit} токенов за {period}; до {resets} "
        "он отклоняет запросы. Поднять лимит: 🔑 Мой ключ → 🚦 Лимиты."
    ),
    "key_alert_100_total": (
        "⛔ Ключ «{name}» (…{hint}) исчерпал лимит в {limit} токенов; он отклоняет запросы, "
        "пока вы не поднимете лимит: 🔑 Мой ключ → 🚦 Лимиты."
    ),
    "key_alert_expiry": (
        "⏳ Ключ «{name}» (…{hint}) перестанет действовать {when}. Продлите его в 🔑 Мой ключ → "
        "🚦 Лимиты или создайте новый ключ."
    ),
    "button_older": "« Раньше",
    "button_newer": "Позже »",
    "button_csv": "📄 CSV",
    "button_open_app": "📊 Открыть приложение",
    "menu_button_app": "Приложение",
    "stray_reason_paid": "этот заказ уже был оплачен",
    "stray_reason_unknown": "счёт не соответствует ни одному нашему заказу",
    "stray_reason_someone_else": "счёт был выставлен другому пользователю",
    "stray_refunded": (
        "Этот платёж на {price} ⭐ нельзя зачислить: {reason}. Мы вернули его "
        "полностью; Stars снова на вашем балансе. Идентификатор платежа: "
        "<code>{charge_id}</code>."
    ),
    "stray_pending": (
        "Этот платёж на {price} ⭐ нельзя зачислить: {reason}. Он возвращается "
        "полностью, оператор уже знает; мы напишем, когда возврат завершится. "
        "Идентификатор платежа: <code>{charge_id}</code>."
    ),
    "stray_refunded_later": (
        "↩️ Ваш платёж на {price} ⭐, который нельзя было зачислить, возвращён "
        "полностью. Идентификатор платежа: <code>{charge_id}</code>."
    ),
    "operator_stray": (
        "⚠️ <b>Платёж не удалось зачислить</b>\n"
        "Платёж <code>{charge_id}</code> пользователя {telegram_id}, {price} ⭐, "
        "payload <code>{payload}</code>: {reason}\n"
        "{outcome}"
    ),
    "operator_stray_refunded": "Он сразу возвращён покупателю.",
    "operator_stray_busy": "Возврат уже выполняется.",
    "operator_stray_refused": (
        "Telegram отклонил возврат ({error}): Stars пока у нас. Повторите через "
        "/refund с идентификатором платежа."
    ),
    "operator_stray_unknown": (
        "Исход возврата неизвестен ({error}), и Telegram пока его не показывает. "
        "Повторите через /refund с идентификатором платежа; повтор безопасен."
    ),
    "operator_refund_shortfall": (
        "⚠️ <b>Возврат застал токены израсходованными</b>\n"
        "Платёж <code>{charge_id}</code> пользователя {telegram_id} ({price} ⭐, "
        "{tokens} токенов) возвращён не через бота; {spent} его токенов уже были "
        "израсходованы."
    ),
    "referral_rewarded": (
        "🎁 Приглашённый вами пользователь сделал первую покупку: вам +{tokens} токенов."
    ),
    "referral_linked": (
        "👋 Вы пришли по приглашению: ваш друг получит долю вашей первой покупки, для "
        "вас бесплатно."
    ),
    "starter_tokens": (
        "🎁 На балансе {tokens} токенов, чтобы попробовать API; ключ — в 🔑 Мой ключ."
    ),
    "invite": (
        "🤝 <b>Приглашайте друзей</b>\n"
        "Поделитесь ссылкой: {link}\n"
        "Вы получите {share}% токенов первой покупки каждого приглашённого.\n"
        "Приглашено: {invited} · получено: {earned} токенов"
    ),
    "invite_off": "Сейчас этот магазин не предлагает приглашений.",
    "promo_usage": "Отправьте /promo и код, например <code>/promo WELCOME</code>.",
    "promo_unknown": "Такого промокода нет.",
    "promo_expired": "Срок действия этого промокода истёк.",
    "promo_used_up": "Этот промокод уже исчерпан.",
    "promo_already": "Вы уже активировали этот промокод.",
    "promo_redeemed": (
        "🎁 Код {code}: +{tokens} токенов. Доступно: {available} токенов. Ключ — в 🔑 Мой ключ."
    ),
    "promo_new_usage": (
        "Использование: /promo_new &lt;code&gt; &lt;tokens&gt; &lt;uses&gt; [days valid]"
    ),
    "promo_new_invalid": "Код — это 3-32 буквы, цифры, _ или -; «{code}» не подходит.",
    "promo_new_exists": "Код «{code}» уже существует.",
    "promo_created": (
        "Промокод <code>{code}</code>: {tokens} токенов, {uses} активаций, действует до {expires}."
    ),
    "promos": "<b>Промокоды</b>",
    "promos_none": "Промокодов пока нет. Создайте через /promo_new.",
    "promos_line": "<code>{code}</code> · {tokens} токенов · {used}/{uses} · до {expires}",
    "paysupport_contact": " Можно также написать {contact}.",
    "paysupport_stray_line": (
        "{time} · {price} ⭐ · <code>{charge_id}</code> · не зачислен, {state}"
    ),
    "paysupport_stray_refunded": "возвращён",
    "paysupport_stray_pending": "возврат ожидается",
    "button_write_support": "💬 Написать в поддержку",
    "support_prompt": "💬 Напишите сообщение в поддержку: отправьте его следующим сообщением.",
    "support_sent": "✅ Сообщение передано операторам; ответ придёт сюда.",
    "support_unreachable": (
        "Сообщение сохранено, но сейчас ни один оператор недоступен. Попробуйте позже."
    ),
    "support_card": (
        "💬 <b>Сообщение в поддержку</b> от {name}{username} (id {telegram_id}, "
        "{language})\n"
        "Доступно: {available} токенов\n"
        "{charges}\n"
        "\n"
        "{text}\n"
        "\n"
        "<i>Ответьте на это сообщение, чтобы ответить покупателю.</i>"
    ),
    "support_card_charge": "• {pack} · {price} ⭐ · <code>{charge_id}</code>{refunded}",
    "support_card_stray": "• не зачислен · {price} ⭐ · <code>{charge_id}</code> · {state}",
    "support_reply": ("💬 <b>Поддержка</b>:\n{text}"),
    "support_reply_sent": "✅ Отправлено: {name}.",
    "support_reply_failed": "Не удалось связаться с покупателем ({error}).",
    "refund_confirm": (
        "<b>Вернуть платёж</b> <code>{charge_id}</code>?\n"
        "Пользователь {telegram_id} · {pack} · {price} ⭐ · {tokens} токенов · {time}\n"
        "У покупателя доступно {available} токенов. Telegram вернёт все {price} ⭐; "
        "затем будет списано {reversible} токенов, а {spent} уже израсходованных "
        "останутся израсходованными."
    ),
    "button_refund_yes": "Вернуть {price} ⭐",
    "refund_cancelled": "Возврат отменён; ничего не изменено.",
    "refund_outcome_unknown": (
        "Telegram не подтвердил возврат <code>{charge_id}</code> ({error}) и пока его "
        "не показывает. Учёт не изменён; повторите /refund через минуту: повтор безопасен."
    ),
    "refund_stray_done": (
        "Платёж <code>{charge_id}</code> пользователя {telegram_id} ({price} ⭐, "
        "{time}) не зачислялся ({reason}); он возвращён {refunded}."
    ),
    "refund_stray_now": (
        "Платёж <code>{charge_id}</code> пользователя {telegram_id} ({price} ⭐, "
        "{time}) не зачислялся ({reason}); он возвращён сейчас."
    ),
    "refund_stray_busy": (
        "Возврат платежа <code>{charge_id}</code> выполняется прямо сейчас; попробуйте "
        "через минуту."
    ),
    "language_choose": "Выберите язык бота:",
    "language_set": "Язык: {name}.",
    "menu_updated": "Меню обновлено.",
    "button_claim": "↩️ Вернуть {pack} ({price} ⭐)",
    "claim_unknown": "Эта покупка не ваша или её больше нет.",
    "claim_already": "Платёж <code>{charge_id}</code> уже возвращён.",
    "claim_sent": (
        "Запрос на возврат <code>{charge_id}</code> передан операторам; ответ придёт сюда."
    ),
    "claim_reason_window": "срок возврата прошёл",
    "claim_reason_used": "токены пакета израсходованы",
    "claim_reason_referral": "покупка принесла награду за приглашение",
    "operator_claim": (
        "↩️ <b>Запрос на возврат</b> от {name} (id {telegram_id})\n"
        "Платёж <code>{charge_id}</code> · {pack} · {price} ⭐ · {tokens} токенов · {time}\n"
        "Доступно: {available} токенов; после возврата останется израсходовано {spent}.\n"
        "Не возвращён автоматически: {reasons}.\n"
        "<i>Верните кнопкой или ответьте на это сообщение.</i>"
    ),
    "operator_claim_refunded": (
        "↩️ Возвращено по правилу условий: платёж <code>{charge_id}</code> "
        "пользователя {telegram_id}, {price} ⭐, списано {tokens} токенов."
    ),
    # Model prices, under /help and /terms: from the settings the API bills with.
    "prices": "<b>Цены</b> (токенов баланса за токен; запрос / ответ, где они разные)",
    "price_line": "• <code>{model}</code>: {price}",
    "prices_flat": "<b>Цены</b>: любая модель стоит 1 токен баланса за токен.",
    # Monthly plans (Telegram Stars subscriptions).
    "command_plan": "Мой тариф на месяц",
    "packs_plans": (
        "🔁 Тарифы продлеваются каждые 30 дней, пока вы не отмените их в /plan; "
        "неизрасходованные токены переносятся."
    ),
    "plan_button": "🔁 {title} · {tokens} токенов/мес · {price} ⭐/мес",
    "terms_prompt_plans": (
        "• Тариф оплачивается каждые 30 дней, пока вы его не отмените (/plan); каждый "
        "платёж добавляет токены тарифа, неизрасходованные переносятся. Отменённый тариф "
        "действует до конца оплаченного периода."
    ),
    "terms_plans": (
        "6. Тарифы: тариф оплачивается в Telegram Stars каждые 30 дней, пока вы не "
        "отмените его в /plan. Каждый платёж зачисляет токены тарифа один раз; "
        "неизрасходованные токены переносятся на следующий период и не сгорают. Отмена "
        "останавливает следующий платёж, а оплаченный период действует до конца. "
        "Продление, которое Telegram не списал, ничего не добавляет. Каждый платёж можно "
        "вернуть, как платёж за пакет (пункт 3)."
    ),
    "plan_invoice_title": "{title}: {tokens}/мес",
    "plan_invoice_description": (
        "{tokens} токенов для API, совместимого с OpenAI, каждые 30 дней; оплата в Stars, "
        "пока вы не отмените в /plan. Неизрасходованные токены переносятся."
    ),
    "plan_invoice_label": "{tokens} токенов каждые 30 дней",
    "plan_invoice": (
        "🔁 <b>{title}</b>: {tokens} токенов каждые 30 дней за {price} ⭐. Нажмите ниже, "
        "чтобы подписаться; отменить можно в любой момент в /plan."
    ),
    "button_subscribe": "⭐ Подписаться за {price} ⭐/мес",
    "plan_unknown": "Этот тариф больше не продаётся. Вот текущие пакеты и тарифы.",
    "plan_line": (
        "🔁 <b>{title}</b> · {tokens} токенов каждые 30 дней · {price} ⭐ · продлений: "
        "{renewals}\n{state}"
    ),
    "plan_state_renews": "Следующее продление: {date}, {price} ⭐.",
    "plan_state_canceled": "Отменён: действует до {date} и не продлится.",
    "plan_state_ended": "Закончился {date}.",
    "plans_none": "У вас нет действующего тарифа. Тариф добавляет токены каждые 30 дней:",
    "plans_off": "Сейчас месячных тарифов нет; пакеты — в /buy.",
    "button_plan_cancel": "Отменить продление",
    "button_plan_resume": "Возобновить продление",
    "plan_canceled": (
        "Тариф {plan} не продлится. Он действует до {date}; до этого его можно возобновить."
    ),
    "plan_resumed": "Тариф {plan} снова продлится {date}.",
    "plan_gone": "Этот тариф не ваш или больше не существует.",
    "plan_over": "Этот тариф закончился; подпишитесь снова в /buy.",
    "plan_pending": (
        "Первый платёж за этот тариф ещё сверяется с данными Telegram; попробуйте через час."
    ),
    "plan_edit_failed": "Telegram отклонил изменение ({error}). Ничего не изменено.",
    "payment_plan_started": (
        "✅ Тариф {plan} подключён: +{tokens} токенов.\n"
        "Доступно сейчас: {available} токенов.\n"
        "Следующее продление: {date}, {price} ⭐; отменить можно в /plan."
    ),
    "payment_plan_renewed": (
        "🔁 Тариф {plan} продлён: +{tokens} токенов (неизрасходованные перенесены).\n"
        "Доступно сейчас: {available} токенов.\n"
        "Следующее продление: {date}, {price} ⭐."
    ),
    "plan_reminder": (
        "🔁 Ваш тариф {plan} продлится {date}: {price} ⭐ за ещё {tokens} токенов; "
        "неизрасходованные переносятся. Чтобы остановить, отмените в /plan."
    ),
    "paysupport_plan_charge": "🔁 {plan}",
    "stats_plans": (
        "🔁 <b>Тарифы</b>: действуют {active}, из них отменены {ending}\n"
        "Сегодня: {today}\n"
        "За всё время: {total}"
    ),
    "stats_plans_block": (
        "новых {started} · продлений {renewals} · отменено {cancellations} · закончилось "
        "{ended} · {revenue} ⭐"
    ),
}
