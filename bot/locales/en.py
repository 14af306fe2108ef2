"""The bot's English texts. Adding a language is adding a file like this one: its `NAME`, shown in
the language picker, and a text for every id of the English file, with the same placeholders."""

from __future__ import annotations

NAME = "English"

TEXTS: dict[str, str] = {
    # The command menu Telegram shows next to the input field.
    "command_start": "Menu",
    "command_buy": "Buy tokens",
    "command_key": "My API keys",
    "command_balance": "Balance and usage",
    "command_paysupport": "Payments, refunds and support",
    "command_terms": "Terms of service",
    "command_privacy": "Privacy policy",
    "command_help": "Help",
    # The menu (a persistent reply keyboard); the labels are also what the buttons send.
    "button_buy": "🛒 Buy tokens",
    "button_key": "🔑 My key",
    "button_balance": "💰 Balance",
    "button_help": "❓ Help",
    "welcome": (
        "Hi, {name}! This bot sells access to an OpenAI-compatible API.\n"
        "\n"
        "Buy a pack of tokens for Telegram Stars and your API key is ready at once: "
        "change only <code>base_url</code> and <code>api_key</code> in any OpenAI client.\n"
        "\n"
        "Use the menu below."
    ),
    "help": (
        "<b>How it works</b>\n"
        "1. 🛒 Buy tokens: pick a pack and pay with Telegram Stars.\n"
        "2. 🔑 My key: your API key and a ready-to-paste example.\n"
        "3. Every request costs its prompt plus completion tokens.\n"
        "\n"
        "/balance — tokens left and recent requests\n"
        "/key — your API key\n"
        "/buy — token packs\n"
        "/paysupport — your payments and refunds\n"
        "/terms — terms of service\n"
        "/privacy — privacy policy"
    ),
    "unknown_command": "I don't know that command. Send /help to see what I can do.",
    "apology": "Sorry, something went wrong on our side. Please try again in a minute.",
    # Terms, accepted with one tap before the first purchase.
    "terms_prompt": (
        "Before your first purchase, please accept the terms:\n"
        "\n"
        "• Tokens are a prepaid balance for API requests; they do not expire.\n"
        "• Unused tokens of a pack can be refunded through /paysupport.\n"
        "• Keep your API key secret; you can rotate it at any time.\n"
        "\n"
        "Full text: /terms · Privacy: /privacy"
    ),
    "button_accept_terms": "✅ I accept",
    "terms": (
        "<b>Terms of service</b>\n"
        "\n"
        "1. You buy prepaid tokens for an OpenAI-compatible text-generation API. A "
        "request costs its prompt tokens plus its completion tokens.\n"
        "2. Payments are made in Telegram Stars. Tokens are credited once the payment "
        "succeeds and do not expire.\n"
        "3. Refunds: write via /paysupport. A refund removes the pack's tokens that "
        "are still unused.\n"
        "4. The API key is personal. Do not share it; rotate it under 🔑 My key if it "
        "leaks.\n"
        "5. The service is provided as is; generated text may be wrong."
    ),
    "privacy": (
        "<b>Privacy policy</b>\n"
        "\n"
        "We store your Telegram id, name and language, your payments and your token "
        "usage (time, model, token counts). We do not store the text of your requests "
        "or of the answers. Your API key is not stored either: only a hash of it.\n"
        "To have your data deleted, write via /paysupport."
    ),
    # Buying.
    "packs": "Choose a pack. You pay in Telegram Stars ⭐.",
    "pack_button": "{title} · {tokens} tokens · {price} ⭐",
    "invoice_title": "{title}: {tokens} tokens",
    "invoice_description": (
        "{tokens} tokens for the OpenAI-compatible API. Credited right after payment."
    ),
    "invoice_label": "{tokens} tokens",
    "payment_received": (
        "✅ Payment received: +{tokens} tokens.\nAvailable now: {available} tokens."
    ),
    "payment_first_key": "🔑 Here is your API key. It also stays under 🔑 My key.\n\n{snippet}",
    "payment_problem": (
        "We received your payment but could not match it to an order. The operator has "
        "been told and will sort it out; your charge id is <code>{charge_id}</code>."
    ),
    "snippet": (
        "API key: <code>{key}</code>\n"
        "Base URL: <code>{base_url}</code>\n"
        "\n"
        "<b>curl</b>\n"
        "{curl}\n"
        "\n"
        "<b>Python (openai)</b>\n"
        "{python}"
    ),
    # Pre-checkout refusals (Telegram shows them in the payment form).
    "order_unknown": "This invoice is not known. Please choose a pack again.",
    "order_someone_else": "This invoice belongs to someone else.",
    "order_paid": "This invoice has already been paid.",
    "order_expired": "This invoice has expired. Please choose a pack again.",
    "order_price": "The price has changed. Please choose a pack again.",
    "order_generic": "This invoice cannot be paid. Please choose a pack again.",
    "pack_unknown": "That pack is no longer sold. Here are the current ones.",
    # My key.
    "key_none": "You get an API key with your first pack. Choose one:",
    "key_show": (
        "🔑 Your API key: <code>{masked}</code>\n"
        "Tap to reveal: <tg-spoiler>{key}</tg-spoiler>\n"
        "\n"
        "Base URL: <code>{base_url}</code>"
    ),
    "button_snippet": "📋 Setup example",
    "button_rotate": "♻️ Rotate key",
    "rotate_confirm": (
        "Rotate the key? The current key stops working at once, and every program that "
        "uses it needs the new one."
    ),
    "button_rotate_yes": "Yes, rotate",
    "button_cancel": "Cancel",
    "rotated": "♻️ Done. The old key no longer works. Your new key:\n\n{snippet}",
    "rotate_cancelled": "The key was not changed.",
    # Balance.
    "balance": (
        "💰 <b>Available: {available} tokens</b>\n"
        "In use by running requests: {held}\n"
        "Purchased: {purchased} · Granted: {granted}\n"
        "Used: {used} · Refunded: {refunded}"
    ),
    "balance_history": "\n<b>Recent requests</b>",
    "balance_history_line": "{time} · {model} · {tokens}",
    "balance_no_history": "\nNo requests yet.",
    "balance_empty_hint": "\nYour balance is empty: 🛒 Buy tokens to continue.",
    # Support.
    "paysupport": (
        "<b>Payments and refunds</b>\n"
        "{purchases}\n"
        "\n"
        "To ask for a refund, write to {contact} and quote the charge id. A refund "
        "returns the Stars and removes the pack's unused tokens."
    ),
    "paysupport_contact_default": "the operator of this bot",
    "paysupport_none": "You have no payments yet.",
    "paysupport_line": "{time} · {pack} · {price} ⭐ · <code>{charge_id}</code>{refunded}",
    "paysupport_refunded": " · refunded",
    # Refunds and grants, as the buyer sees them.
    "refunded": (
        "↩️ Your payment for {pack} ({price} ⭐) was refunded; {tokens} tokens were removed."
    ),
    "granted": "🎁 You received {tokens} tokens. Your API key is under 🔑 My key.",
    # Notices, sent once per crossing by a job.
    "notice_low": "⚠️ Your balance is low: {available} tokens left. 🛒 Buy tokens to top up.",
    "notice_empty": "⛔️ Your tokens have run out; API requests are refused until you top up.",
    # Operators.
    "stats": "📊 <b>Today</b> (UTC)\n{today}\n\n<b>All time</b>\n{total}",
    "stats_block": (
        "Buyers: {buyers} · Purchases: {purchases}\n"
        "Revenue: {revenue} ⭐ (refunded {refunded} ⭐)\n"
        "Tokens sold: {sold} · granted: {granted} · used: {used}"
    ),
    "refund_usage": "Usage: /refund &lt;charge_id&gt;",
    "refund_unknown": "No purchase with charge id <code>{charge_id}</code>.",
    "refund_already": "Charge <code>{charge_id}</code> was already refunded.",
    "refund_telegram_failed": "Telegram refused the refund ({error}). Nothing was changed.",
    "refund_done": (
        "Refunded {price} ⭐ for <code>{charge_id}</code>: {tokens} tokens reversed{shortfall}."
    ),
    "refund_shortfall": ", {tokens} were already spent",
    "grant_usage": "Usage: /grant &lt;telegram_id&gt; &lt;tokens&gt;",
    "grant_no_account": "Telegram user {telegram_id} has not started the bot yet.",
    "grant_done": "Granted {tokens} tokens to {telegram_id}. Available now: {available}.",
    "invalid_amount": "The amount must be a positive whole number of tokens.",
    "operator_alert": "⚠️ <b>A payment needs a look</b>\n{items}",
    "reconcile_report": "🧾 <b>Star transactions vs purchases</b>\n{items}",
}
