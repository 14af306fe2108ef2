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
        "2. 🔑 Мой ключ: ваш API-ключ и готовый пример.\n"
        "3. Каждый запрос стоит токены запроса плюс токены ответа.\n"
        "\n"
        "/balance — остаток и последние запросы\n"
        "/key — ваш API-ключ\n"
        "/buy — пакеты токенов\n"
        "/paysupport — ваши платежи и возвраты\n"
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
        "• Неиспользованные токены пакета можно вернуть через /paysupport.\n"
        "• Храните API-ключ в секрете; его можно заменить в любой момент.\n"
        "\n"
        "Полный текст: /terms · Конфиденциальность: /privacy"
    ),
    "button_accept_terms": "✅ Принимаю",
    "terms": (
        "<b>Условия использования</b>\n"
        "\n"
        "1. Вы покупаете предоплаченные токены для API генерации текста, совместимого "
        "с OpenAI. Запрос стоит токены запроса плюс токены ответа.\n"
        "2. Оплата — в Telegram Stars. Токены зачисляются после успешной оплаты и не "
        "сгорают.\n"
        "3. Возвраты: через /paysupport. Возврат списывает ещё не использованные "
        "токены пакета.\n"
        "4. API-ключ личный. Не передавайте его; при утечке замените его в 🔑 Мой ключ.\n"
        "5. Сервис предоставляется как есть; сгенерированный текст может быть неверным."
    ),
    "privacy": (
        "<b>Политика конфиденциальности</b>\n"
        "\n"
        "Мы храним ваш Telegram id, имя и язык, ваши платежи и расход токенов (время, "
        "модель, число токенов). Тексты запросов и ответов мы не храним. Ваш API-ключ "
        "тоже не хранится: только его хеш.\n"
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
    "payment_problem": (
        "Мы получили оплату, но не смогли сопоставить её с заказом. Оператор уже знает "
        "и разберётся; ваш идентификатор платежа: <code>{charge_id}</code>."
    ),
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
        "🔑 Ваш API-ключ: <code>{masked}</code>\n"
        "Нажмите, чтобы показать: <tg-spoiler>{key}</tg-spoiler>\n"
        "\n"
        "Base URL: <code>{base_url}</code>"
    ),
    "button_snippet": "📋 Пример подключения",
    "button_rotate": "♻️ Заменить ключ",
    "rotate_confirm": (
        "Заменить ключ? Текущий ключ сразу перестанет работать, и во всех программах, "
        "где он используется, понадобится новый."
    ),
    "button_rotate_yes": "Да, заменить",
    "button_cancel": "Отмена",
    "rotated": "♻️ Готово. Старый ключ больше не работает. Ваш новый ключ:\n\n{snippet}",
    "rotate_cancelled": "Ключ не изменён.",
    # Balance.
    "balance": (
        "💰 <b>Доступно: {available} токенов</b>\n"
        "Занято выполняющимися запросами: {held}\n"
        "Куплено: {purchased} · Начислено: {granted}\n"
        "Израсходовано: {used} · Возвращено: {refunded}"
    ),
    "balance_history": "\n<b>Последние запросы</b>",
    "balance_history_line": "{time} · {model} · {tokens}",
    "balance_no_history": "\nЗапросов пока не было.",
    "balance_empty_hint": "\nБаланс пуст: 🛒 купите токены, чтобы продолжить.",
    # Support.
    "paysupport": (
        "<b>Платежи и возвраты</b>\n"
        "{purchases}\n"
        "\n"
        "Чтобы запросить возврат, напишите {contact} и укажите идентификатор платежа. "
        "При возврате Stars возвращаются, а неиспользованные токены пакета списываются."
    ),
    "paysupport_contact_default": "оператору бота",
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
}
