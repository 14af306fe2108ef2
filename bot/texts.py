"""Every string the bot shows, in English and Russian, in one place.

Replies use Telegram's HTML parse mode. `t()` escapes every string value it is given, except
`Html` values (text that `t()` itself produced), so a buyer's name or a pack title can never
inject markup, and composed messages are not escaped twice.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import Literal

Lang = Literal["en", "ru"]
LANGUAGES: tuple[Lang, ...] = ("en", "ru")


class Html(str):
    """A string that is already valid Telegram HTML."""


def language_for(code: str | None) -> Lang:
    """The reply language for a Telegram `language_code` (e.g. "ru", "ru-RU", "en-GB")."""
    return "ru" if code and code.lower().split("-")[0] == "ru" else "en"


def number(lang: Lang, value: int) -> str:
    """12,345 in English, 12 345 in Russian."""
    grouped = f"{value:,}"
    return grouped.replace(",", "\u00a0") if lang == "ru" else grouped


def when(value: datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M} UTC"


def t(lang: Lang, text_id: str, /, **values: object) -> Html:
    template = TEXTS[text_id][lang]
    safe = {
        name: value if isinstance(value, Html) else html.escape(str(value), quote=False)
        for name, value in values.items()
    }
    return Html(template.format(**safe))


def plain(lang: Lang, text_id: str, /, **values: object) -> str:
    """For places Telegram does not parse as HTML: buttons, invoices, pre-checkout errors."""
    return TEXTS[text_id][lang].format(**values)


def lines(parts: list[Html]) -> Html:
    return Html("\n".join(parts))


def snippet(lang: Lang, *, key: str, base_url: str, model: str) -> Html:
    """The ready-to-paste setup: base URL, a curl call and an `openai` SDK call."""
    curl = (
        f"curl {base_url}/chat/completions \\\n"
        f'  -H "Authorization: Bearer {key}" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\''
    )
    python = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}", api_key="{key}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.choices[0].message.content)"
    )
    return t(
        lang,
        "snippet",
        key=key,
        base_url=base_url,
        curl=Html(
            f'<pre><code class="language-bash">{html.escape(curl, quote=False)}</code></pre>'
        ),
        python=Html(
            f'<pre><code class="language-python">{html.escape(python, quote=False)}</code></pre>'
        ),
    )


TEXTS: dict[str, dict[Lang, str]] = {
    # The menu (a persistent reply keyboard); the labels are also what the buttons send.
    "button_buy": {"en": "🛒 Buy tokens", "ru": "🛒 Купить токены"},
    "button_key": {"en": "🔑 My key", "ru": "🔑 Мой ключ"},
    "button_balance": {"en": "💰 Balance", "ru": "💰 Баланс"},
    "button_help": {"en": "❓ Help", "ru": "❓ Помощь"},
    "welcome": {
        "en": (
            "Hi, {name}! This bot sells access to an OpenAI-compatible API.\n\n"
            "Buy a pack of tokens for Telegram Stars and your API key is ready at once: "
            "change only <code>base_url</code> and <code>api_key</code> in any OpenAI client.\n\n"
            "Use the menu below."
        ),
        "ru": (
            "Привет, {name}! Этот бот продаёт доступ к API, совместимому с OpenAI.\n\n"
            "Купите пакет токенов за Telegram Stars, и API-ключ будет готов сразу: "
            "в любом клиенте OpenAI поменяйте только <code>base_url</code> и "
            "<code>api_key</code>.\n\nПользуйтесь меню ниже."
        ),
    },
    "help": {
        "en": (
            "<b>How it works</b>\n"
            "1. 🛒 Buy tokens: pick a pack and pay with Telegram Stars.\n"
            "2. 🔑 My key: your API key and a ready-to-paste example.\n"
            "3. Every request costs its prompt plus completion tokens.\n\n"
            "/balance — tokens left and recent requests\n"
            "/key — your API key\n"
            "/buy — token packs\n"
            "/paysupport — your payments and refunds\n"
            "/terms — terms of service\n"
            "/privacy — privacy policy"
        ),
        "ru": (
            "<b>Как это работает</b>\n"
            "1. 🛒 Купить токены: выберите пакет и оплатите Telegram Stars.\n"
            "2. 🔑 Мой ключ: ваш API-ключ и готовый пример.\n"
            "3. Каждый запрос стоит токены запроса плюс токены ответа.\n\n"
            "/balance — остаток и последние запросы\n"
            "/key — ваш API-ключ\n"
            "/buy — пакеты токенов\n"
            "/paysupport — ваши платежи и возвраты\n"
            "/terms — условия использования\n"
            "/privacy — политика конфиденциальности"
        ),
    },
    "unknown_command": {
        "en": "I don't know that command. Send /help to see what I can do.",
        "ru": "Я не знаю такой команды. Отправьте /help, чтобы увидеть, что я умею.",
    },
    "apology": {
        "en": "Sorry, something went wrong on our side. Please try again in a minute.",
        "ru": "Извините, у нас что-то пошло не так. Попробуйте ещё раз через минуту.",
    },
    # Terms, accepted with one tap before the first purchase.
    "terms_prompt": {
        "en": (
            "Before your first purchase, please accept the terms:\n\n"
            "• Tokens are a prepaid balance for API requests; they do not expire.\n"
            "• Unused tokens of a pack can be refunded through /paysupport.\n"
            "• Keep your API key secret; you can rotate it at any time.\n\n"
            "Full text: /terms · Privacy: /privacy"
        ),
        "ru": (
            "Перед первой покупкой примите, пожалуйста, условия:\n\n"
            "• Токены — это предоплаченный баланс для запросов к API; они не сгорают.\n"
            "• Неиспользованные токены пакета можно вернуть через /paysupport.\n"
            "• Храните API-ключ в секрете; его можно заменить в любой момент.\n\n"
            "Полный текст: /terms · Конфиденциальность: /privacy"
        ),
    },
    "button_accept_terms": {"en": "✅ I accept", "ru": "✅ Принимаю"},
    "terms": {
        "en": (
            "<b>Terms of service</b>\n\n"
            "1. You buy prepaid tokens for an OpenAI-compatible text-generation API. "
            "A request costs its prompt tokens plus its completion tokens.\n"
            "2. Payments are made in Telegram Stars. Tokens are credited once the payment "
            "succeeds and do not expire.\n"
            "3. Refunds: write via /paysupport. A refund removes the pack's tokens that are "
            "still unused.\n"
            "4. The API key is personal. Do not share it; rotate it under 🔑 My key if it leaks.\n"
            "5. The service is provided as is; generated text may be wrong."
        ),
        "ru": (
            "<b>Условия использования</b>\n\n"
            "1. Вы покупаете предоплаченные токены для API генерации текста, совместимого с "
            "OpenAI. Запрос стоит токены запроса плюс токены ответа.\n"
            "2. Оплата — в Telegram Stars. Токены зачисляются после успешной оплаты и не "
            "сгорают.\n"
            "3. Возвраты: через /paysupport. Возврат списывает ещё не использованные токены "
            "пакета.\n"
            "4. API-ключ личный. Не передавайте его; при утечке замените его в 🔑 Мой ключ.\n"
            "5. Сервис предоставляется как есть; сгенерированный текст может быть неверным."
        ),
    },
    "privacy": {
        "en": (
            "<b>Privacy policy</b>\n\n"
            "We store your Telegram id, name and language, your payments and your token "
            "usage (time, model, token counts). We do not store the text of your requests or "
            "of the answers. Your API key is not stored either: only a hash of it.\n"
            "To have your data deleted, write via /paysupport."
        ),
        "ru": (
            "<b>Политика конфиденциальности</b>\n\n"
            "Мы храним ваш Telegram id, имя и язык, ваши платежи и расход токенов (время, "
            "модель, число токенов). Тексты запросов и ответов мы не храним. Ваш API-ключ "
            "тоже не хранится: только его хеш.\n"
            "Чтобы удалить ваши данные, напишите через /paysupport."
        ),
    },
    # Buying.
    "packs": {
        "en": "Choose a pack. You pay in Telegram Stars ⭐.",
        "ru": "Выберите пакет. Оплата в Telegram Stars ⭐.",
    },
    "pack_button": {
        "en": "{title} · {tokens} tokens · {price} ⭐",
        "ru": "{title} · {tokens} токенов · {price} ⭐",
    },
    "invoice_title": {"en": "{title}: {tokens} tokens", "ru": "{title}: {tokens} токенов"},
    "invoice_description": {
        "en": "{tokens} tokens for the OpenAI-compatible API. Credited right after payment.",
        "ru": "{tokens} токенов для API, совместимого с OpenAI. Зачисляются сразу после оплаты.",
    },
    "invoice_label": {"en": "{tokens} tokens", "ru": "{tokens} токенов"},
    "payment_received": {
        "en": "✅ Payment received: +{tokens} tokens.\nAvailable now: {available} tokens.",
        "ru": "✅ Оплата получена: +{tokens} токенов.\nДоступно: {available} токенов.",
    },
    "payment_first_key": {
        "en": "🔑 Here is your API key. It also stays under 🔑 My key.\n\n{snippet}",
        "ru": "🔑 Вот ваш API-ключ. Он также доступен в 🔑 Мой ключ.\n\n{snippet}",
    },
    "payment_problem": {
        "en": (
            "We received your payment but could not match it to an order. The operator has "
            "been told and will sort it out; your charge id is <code>{charge_id}</code>."
        ),
        "ru": (
            "Мы получили оплату, но не смогли сопоставить её с заказом. Оператор уже знает "
            "и разберётся; ваш идентификатор платежа: <code>{charge_id}</code>."
        ),
    },
    "snippet": {
        "en": (
            "API key: <code>{key}</code>\n"
            "Base URL: <code>{base_url}</code>\n\n"
            "<b>curl</b>\n{curl}\n\n<b>Python (openai)</b>\n{python}"
        ),
        "ru": (
            "API-ключ: <code>{key}</code>\n"
            "Base URL: <code>{base_url}</code>\n\n"
            "<b>curl</b>\n{curl}\n\n<b>Python (openai)</b>\n{python}"
        ),
    },
    # Pre-checkout refusals (Telegram shows them in the payment form).
    "order_unknown": {
        "en": "This invoice is not known. Please choose a pack again.",
        "ru": "Этот счёт не найден. Выберите пакет ещё раз.",
    },
    "order_someone_else": {
        "en": "This invoice belongs to someone else.",
        "ru": "Этот счёт выставлен другому пользователю.",
    },
    "order_paid": {"en": "This invoice has already been paid.", "ru": "Этот счёт уже оплачен."},
    "order_expired": {
        "en": "This invoice has expired. Please choose a pack again.",
        "ru": "Срок действия счёта истёк. Выберите пакет ещё раз.",
    },
    "order_price": {
        "en": "The price has changed. Please choose a pack again.",
        "ru": "Цена изменилась. Выберите пакет ещё раз.",
    },
    "order_generic": {
        "en": "This invoice cannot be paid. Please choose a pack again.",
        "ru": "Этот счёт нельзя оплатить. Выберите пакет ещё раз.",
    },
    "pack_unknown": {
        "en": "That pack is no longer sold. Here are the current ones.",
        "ru": "Этот пакет больше не продаётся. Вот актуальные.",
    },
    # My key.
    "key_none": {
        "en": "You get an API key with your first pack. Choose one:",
        "ru": "API-ключ выдаётся с первым пакетом. Выберите пакет:",
    },
    "key_show": {
        "en": (
            "🔑 Your API key: <code>{masked}</code>\n"
            "Tap to reveal: <tg-spoiler>{key}</tg-spoiler>\n\n"
            "Base URL: <code>{base_url}</code>"
        ),
        "ru": (
            "🔑 Ваш API-ключ: <code>{masked}</code>\n"
            "Нажмите, чтобы показать: <tg-spoiler>{key}</tg-spoiler>\n\n"
            "Base URL: <code>{base_url}</code>"
        ),
    },
    "button_snippet": {"en": "📋 Setup example", "ru": "📋 Пример подключения"},
    "button_rotate": {"en": "♻️ Rotate key", "ru": "♻️ Заменить ключ"},
    "rotate_confirm": {
        "en": (
            "Rotate the key? The current key stops working at once, and every program that "
            "uses it needs the new one."
        ),
        "ru": (
            "Заменить ключ? Текущий ключ сразу перестанет работать, и во всех программах, "
            "где он используется, понадобится новый."
        ),
    },
    "button_rotate_yes": {"en": "Yes, rotate", "ru": "Да, заменить"},
    "button_cancel": {"en": "Cancel", "ru": "Отмена"},
    "rotated": {
        "en": "♻️ Done. The old key no longer works. Your new key:\n\n{snippet}",
        "ru": "♻️ Готово. Старый ключ больше не работает. Ваш новый ключ:\n\n{snippet}",
    },
    "rotate_cancelled": {
        "en": "The key was not changed.",
        "ru": "Ключ не изменён.",
    },
    # Balance.
    "balance": {
        "en": (
            "💰 <b>Available: {available} tokens</b>\n"
            "In use by running requests: {held}\n"
            "Purchased: {purchased} · Granted: {granted}\n"
            "Used: {used} · Refunded: {refunded}"
        ),
        "ru": (
            "💰 <b>Доступно: {available} токенов</b>\n"
            "Занято выполняющимися запросами: {held}\n"
            "Куплено: {purchased} · Начислено: {granted}\n"
            "Израсходовано: {used} · Возвращено: {refunded}"
        ),
    },
    "balance_history": {"en": "\n<b>Recent requests</b>", "ru": "\n<b>Последние запросы</b>"},
    "balance_history_line": {
        "en": "{time} · {model} · {tokens}",
        "ru": "{time} · {model} · {tokens}",
    },
    "balance_no_history": {"en": "\nNo requests yet.", "ru": "\nЗапросов пока не было."},
    "balance_empty_hint": {
        "en": "\nYour balance is empty: 🛒 Buy tokens to continue.",
        "ru": "\nБаланс пуст: 🛒 купите токены, чтобы продолжить.",
    },
    # Support.
    "paysupport": {
        "en": (
            "<b>Payments and refunds</b>\n{purchases}\n\n"
            "To ask for a refund, write to {contact} and quote the charge id. A refund returns "
            "the Stars and removes the pack's unused tokens."
        ),
        "ru": (
            "<b>Платежи и возвраты</b>\n{purchases}\n\n"
            "Чтобы запросить возврат, напишите {contact} и укажите идентификатор платежа. "
            "При возврате Stars возвращаются, а неиспользованные токены пакета списываются."
        ),
    },
    "paysupport_contact_default": {"en": "the operator of this bot", "ru": "оператору бота"},
    "paysupport_none": {"en": "You have no payments yet.", "ru": "Платежей пока нет."},
    "paysupport_line": {
        "en": "{time} · {pack} · {price} ⭐ · <code>{charge_id}</code>{refunded}",
        "ru": "{time} · {pack} · {price} ⭐ · <code>{charge_id}</code>{refunded}",
    },
    "paysupport_refunded": {"en": " · refunded", "ru": " · возвращён"},
    # Refunds and grants, as the buyer sees them.
    "refunded": {
        "en": "↩️ Your payment for {pack} ({price} ⭐) was refunded; {tokens} tokens were removed.",
        "ru": "↩️ Платёж за {pack} ({price} ⭐) возвращён; списано {tokens} токенов.",
    },
    "granted": {
        "en": "🎁 You received {tokens} tokens. Your API key is under 🔑 My key.",
        "ru": "🎁 Вам начислено {tokens} токенов. API-ключ — в 🔑 Мой ключ.",
    },
    # Notices, sent once per crossing by a job.
    "notice_low": {
        "en": "⚠️ Your balance is low: {available} tokens left. 🛒 Buy tokens to top up.",
        "ru": "⚠️ Баланс на исходе: осталось {available} токенов. 🛒 Пополните его.",
    },
    "notice_empty": {
        "en": "⛔️ Your tokens have run out; API requests are refused until you top up.",
        "ru": "⛔️ Токены закончились; запросы к API отклоняются, пока вы не пополните баланс.",
    },
    # Operators.
    "stats": {
        "en": ("📊 <b>Today</b> (UTC)\n{today}\n\n<b>All time</b>\n{total}"),
        "ru": ("📊 <b>Сегодня</b> (UTC)\n{today}\n\n<b>За всё время</b>\n{total}"),
    },
    "stats_block": {
        "en": (
            "Buyers: {buyers} · Purchases: {purchases}\n"
            "Revenue: {revenue} ⭐ (refunded {refunded} ⭐)\n"
            "Tokens sold: {sold} · granted: {granted} · used: {used}"
        ),
        "ru": (
            "Покупателей: {buyers} · Покупок: {purchases}\n"
            "Выручка: {revenue} ⭐ (возвращено {refunded} ⭐)\n"
            "Токенов продано: {sold} · начислено: {granted} · израсходовано: {used}"
        ),
    },
    "refund_usage": {
        "en": "Usage: /refund &lt;charge_id&gt;",
        "ru": "Использование: /refund &lt;charge_id&gt;",
    },
    "refund_unknown": {
        "en": "No purchase with charge id <code>{charge_id}</code>.",
        "ru": "Нет покупки с идентификатором <code>{charge_id}</code>.",
    },
    "refund_already": {
        "en": "Charge <code>{charge_id}</code> was already refunded.",
        "ru": "Платёж <code>{charge_id}</code> уже возвращён.",
    },
    "refund_telegram_failed": {
        "en": "Telegram refused the refund ({error}). Nothing was changed.",
        "ru": "Telegram отклонил возврат ({error}). Ничего не изменено.",
    },
    "refund_done": {
        "en": (
            "Refunded {price} ⭐ for <code>{charge_id}</code>: {tokens} tokens reversed{shortfall}."
        ),
        "ru": (
            "Возвращено {price} ⭐ за <code>{charge_id}</code>: списано {tokens} токенов"
            "{shortfall}."
        ),
    },
    "refund_shortfall": {
        "en": ", {tokens} were already spent",
        "ru": ", {tokens} уже были израсходованы",
    },
    "grant_usage": {
        "en": "Usage: /grant &lt;telegram_id&gt; &lt;tokens&gt;",
        "ru": "Использование: /grant &lt;telegram_id&gt; &lt;tokens&gt;",
    },
    "grant_no_account": {
        "en": "Telegram user {telegram_id} has not started the bot yet.",
        "ru": "Пользователь Telegram {telegram_id} ещё не запускал бота.",
    },
    "grant_done": {
        "en": "Granted {tokens} tokens to {telegram_id}. Available now: {available}.",
        "ru": "Начислено {tokens} токенов пользователю {telegram_id}. Доступно: {available}.",
    },
    "invalid_amount": {
        "en": "The amount must be a positive whole number of tokens.",
        "ru": "Количество должно быть целым положительным числом токенов.",
    },
    "operator_alert": {
        "en": "⚠️ <b>A payment needs a look</b>\n{items}",
        "ru": "⚠️ <b>Платёж требует внимания</b>\n{items}",
    },
    "reconcile_report": {
        "en": "🧾 <b>Star transactions vs purchases</b>\n{items}",
        "ru": "🧾 <b>Транзакции Stars и покупки</b>\n{items}",
    },
}
