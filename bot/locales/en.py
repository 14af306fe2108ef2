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
        "2. 🔑 My key: your API keys and a ready-to-paste example.\n"
        "3. A request costs its prompt tokens times the model's prompt price plus its "
        "completion tokens times the model's completion price (1 each unless the "
        "operator set other prices), rounded up.\n"
        "\n"
        "/balance — tokens left and usage by day and model\n"
        "/key — your API keys\n"
        "/buy — token packs\n"
        "/plan — your monthly plan: next renewal, cancel, resume\n"
        "/paysupport — your payments, refunds and a message to support\n"
        "/promo — redeem a promo code\n"
        "/invite — your invitation link\n"
        "/language — the bot's language\n"
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
        "• A payment is refunded in full or not at all: within {days} days, while the "
        "pack's tokens are still unused (your available balance covers the pack).\n"
        "• Keep your API keys secret; you can rotate or revoke them at any time.\n"
        "\n"
        "Full text: /terms · Privacy: /privacy"
    ),
    "button_accept_terms": "✅ I accept",
    "terms": (
        "<b>Terms of service</b>\n"
        "\n"
        "1. You buy prepaid tokens for an OpenAI-compatible text-generation API. A "
        "request costs its prompt tokens times the model's prompt price plus its "
        "completion tokens times the model's completion price, rounded up; a price is "
        "1 unless the operator set another.\n"
        "2. Payments are made in Telegram Stars. Tokens are credited once the payment "
        "succeeds and do not expire. A payment that cannot be credited is refunded at "
        "once.\n"
        "3. Refunds: Telegram refunds a payment in full or not at all. Within {days} "
        "days of a purchase, while its tokens are unused (your available balance "
        "covers the pack), ask via /paysupport and the payment is refunded and the "
        "pack's tokens removed. Otherwise the operator decides.\n"
        "4. API keys are personal. Do not share them; rotate or revoke a key under 🔑 "
        "My key if it leaks.\n"
        "5. The service is provided as is; generated text may be wrong."
    ),
    "privacy": (
        "<b>Privacy policy</b>\n"
        "\n"
        "We store your Telegram id, name and language, your payments and your token "
        "usage (time, model, token counts). We do not store the text of your requests "
        "or of the answers. Your API keys are not stored either: only a hash of each. "
        "Messages you write to support, and the answers, are kept with your account.\n"
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
        "🔑 <b>{name}</b>: <code>{masked}</code>\n"
        "Tap to reveal: <tg-spoiler>{key}</tg-spoiler>\n"
        "\n"
        "Base URL: <code>{base_url}</code>"
    ),
    "button_snippet": "📋 Setup example",
    "button_rotate": "♻️ Rotate",
    "rotate_confirm": (
        "Rotate the key «{name}»? It stops working at once, and every program that "
        "uses it needs the new one."
    ),
    "button_rotate_yes": "Yes, rotate",
    "button_cancel": "Cancel",
    "rotated": ("♻️ Done. The old «{name}» key no longer works. The new one:\n\n{snippet}"),
    # Balance.
    "balance": (
        "💰 <b>Available: {available} tokens</b>\n"
        "In use by running requests: {held}\n"
        "Purchased: {purchased} · Granted: {granted}\n"
        "Used: {used} · Refunded: {refunded}"
    ),
    "balance_no_history": "\nNo requests yet.",
    "balance_empty_hint": ("\nYour balance is empty: 🛒 Buy tokens to continue."),
    # Support.
    "paysupport": (
        "<b>Payments and refunds</b>\n"
        "{purchases}\n"
        "\n"
        "Telegram refunds a payment in full or not at all. Within {days} days of a "
        "purchase, while its tokens are unused, ask and it is refunded. To write to "
        "the operators, just send your message now (quote the charge id); it reaches "
        "them as it is.{contact}"
    ),
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
    "command_promo": "Redeem a promo code",
    "command_invite": "Invite friends, earn tokens",
    "command_language": "Language",
    "button_support": "💬 Support",
    "key_usage": ("\n<b>This key</b>: {requests} requests, {tokens} tokens billed"),
    "usage_line": (
        "{day} · {model} · {requests} req · prompt {prompt} · completion {completion} "
        "· billed {charged}"
    ),
    "usage_title": ("\n<b>Usage by day and model</b> (UTC, page {page})"),
    "usage_csv": "Every billed request, as CSV.",
    "keys_title": "🔑 <b>Your API keys</b>",
    "keys_line": (
        "• <b>{name}</b> · <code>{masked}</code> · {requests} requests · {tokens} tokens"
    ),
    "keys_empty": "You have no live keys. Create one below.",
    "keys_too_many": "You have {limit} live keys already; revoke one first.",
    "key_created": "➕ New key created.\n",
    "key_default_name": "key {number}",
    "key_gone": "That key no longer exists.",
    "key_unchanged": "The key was not changed.",
    "button_rename": "✏️ Rename",
    "button_revoke": "🗑 Revoke",
    "button_new_key": "➕ New key",
    "button_all_keys": "« All keys",
    "revoke_confirm": (
        "Revoke the key «{name}»? It stops working at once and is not replaced; your "
        "other keys keep working."
    ),
    "button_revoke_yes": "Yes, revoke",
    "revoked": "🗑 The key «{name}» was revoked.\n",
    "renamed": "✏️ The key is now called «{name}».",
    "rename_prompt": "✏️ New name for the key «{name}» (#{id}): reply to this message.",
    "button_limits": "🚦 Limits",
    "key_limits": "\n🚦 <b>Limits</b>: {limits}",
    "key_limits_none": "\n🚦 <b>Limits</b>: none; this key can spend the whole balance.",
    "limit_spend": "spent {spent} of {limit} tokens this {period} (resets {resets})",
    "limit_spend_total": "spent {spent} of {limit} tokens in all",
    "period_daily": "day",
    "period_weekly": "week",
    "period_monthly": "month",
    "limit_expires": "expires {when}",
    "limit_models": "models {models}",
    "limit_rpm": "{rpm} requests a minute",
    "limit_tpm": "{tpm} tokens a minute",
    "limits_prompt": (
        "🚦 Limits for the key «{name}» (#{id}): reply to this message with what to change, "
        "e.g.\nspend 5000 daily; rpm 60; tpm 20000; models demo; expires 2027-01-31\n"
        "Periods: daily, weekly, monthly (UTC) or total. «rpm off» removes one limit, "
        "«clear» removes them all."
    ),
    "limits_set": "🚦 The limits of «{name}» are set; every server applies them within seconds.",
    "limits_invalid": "🚦 Nothing changed: {error}",
    "key_alert_80": (
        "⚠️ Your key «{name}» (…{hint}) has spent {spent} of its {limit} tokens this {period}: "
        "80% of its limit. It resets {resets}."
    ),
    "key_alert_80_total": (
        "⚠️ Your key «{name}» (…{hint}) has spent {spent} of its {limit} tokens: 80% of its limit."
    ),
    "key_alert_100": (
        "⛔ Your key «{name}» (…{hint}) has spent its limit of {limit} tokens this {period}; "
        "it refuses requests until {resets}. Raise it in 🔑 My key → 🚦 Limits."
    ),
    "key_alert_100_total": (
        "⛔ Your key «{name}» (…{hint}) has spent its limit of {limit} tokens; it refuses "
        "requests until you raise it in 🔑 My key → 🚦 Limits."
    ),
    "key_alert_expiry": (
        "⏳ Your key «{name}» (…{hint}) expires {when}. Set a later expiry in 🔑 My key → "
        "🚦 Limits, or create a new key."
    ),
    "button_older": "« Older",
    "button_newer": "Newer »",
    "button_csv": "📄 CSV",
    "button_open_app": "📊 Open the app",
    "menu_button_app": "Open app",
    "stray_reason_paid": "this order had already been paid",
    "stray_reason_unknown": "the invoice matched no order of ours",
    "stray_reason_someone_else": "the invoice belonged to another user",
    "stray_refunded": (
        "This payment of {price} ⭐ could not be credited: {reason}. We have refunded "
        "it in full; the Stars are back on your balance. Charge id: "
        "<code>{charge_id}</code>."
    ),
    "stray_pending": (
        "This payment of {price} ⭐ could not be credited: {reason}. It is being "
        "refunded in full and the operator has been told; you will get a message when "
        "it is done. Charge id: <code>{charge_id}</code>."
    ),
    "stray_refunded_later": (
        "↩️ Your payment of {price} ⭐ that could not be credited has been refunded in "
        "full. Charge id: <code>{charge_id}</code>."
    ),
    "operator_stray": (
        "⚠️ <b>A payment could not be credited</b>\n"
        "Charge <code>{charge_id}</code> of user {telegram_id}, {price} ⭐, payload "
        "<code>{payload}</code>: {reason}\n"
        "{outcome}"
    ),
    "operator_stray_refunded": "It was refunded to the buyer at once.",
    "operator_stray_busy": "Its refund is under way.",
    "operator_stray_refused": (
        "Telegram refused the refund ({error}): the Stars are still ours. Retry with "
        "/refund and the charge id."
    ),
    "operator_stray_unknown": (
        "The refund's outcome is unknown ({error}) and Telegram does not list it yet. "
        "Retry with /refund and the charge id; a repeat is safe."
    ),
    "operator_refund_shortfall": (
        "⚠️ <b>A refund found the tokens spent</b>\n"
        "Charge <code>{charge_id}</code> of user {telegram_id} ({price} ⭐, {tokens} "
        "tokens) was refunded outside the bot; {spent} of its tokens had already been "
        "used and stay used."
    ),
    "referral_rewarded": (
        "🎁 Someone you invited made their first purchase: +{tokens} tokens for you."
    ),
    "referral_linked": (
        "👋 You came with an invitation: your friend gets a share of your first "
        "purchase, at no cost to you."
    ),
    "starter_tokens": (
        "🎁 {tokens} tokens to try the API are on your balance; your key is under 🔑 My key."
    ),
    "invite": (
        "🤝 <b>Invite friends</b>\n"
        "Share this link: {link}\n"
        "You get {share}% of the tokens of each invited buyer's first purchase.\n"
        "Invited: {invited} · earned: {earned} tokens"
    ),
    "invite_off": "Invitations are not offered by this shop at the moment.",
    "promo_usage": "Send /promo followed by the code, e.g. <code>/promo WELCOME</code>.",
    "promo_unknown": "There is no such promo code.",
    "promo_expired": "This promo code has expired.",
    "promo_used_up": "This promo code has been used up.",
    "promo_already": "You have already redeemed this promo code.",
    "promo_redeemed": (
        "🎁 Code {code}: +{tokens} tokens. Available now: {available} tokens. Your key "
        "is under 🔑 My key."
    ),
    "promo_new_usage": ("Usage: /promo_new &lt;code&gt; &lt;tokens&gt; &lt;uses&gt; [days valid]"),
    "promo_new_invalid": "A code is 3-32 letters, digits, _ or -; «{code}» is not.",
    "promo_new_exists": "The code «{code}» exists already.",
    "promo_created": (
        "Promo code <code>{code}</code>: {tokens} tokens, {uses} uses, valid until {expires}."
    ),
    "promos": "<b>Promo codes</b>",
    "promos_none": "No promo codes yet. Create one with /promo_new.",
    "promos_line": ("<code>{code}</code> · {tokens} tokens · used {used}/{uses} · until {expires}"),
    "paysupport_contact": " You can also write to {contact}.",
    "paysupport_stray_line": (
        "{time} · {price} ⭐ · <code>{charge_id}</code> · not credited, {state}"
    ),
    "paysupport_stray_refunded": "refunded",
    "paysupport_stray_pending": "refund pending",
    "button_write_support": "💬 Write to support",
    "support_prompt": "💬 Write your message to support: send it now, as your next message.",
    "support_sent": "✅ Your message was passed to the operators; their answer will come here.",
    "support_unreachable": (
        "Your message was saved, but no operator could be reached right now. Please "
        "try again later."
    ),
    "support_card": (
        "💬 <b>Support message</b> from {name}{username} (id {telegram_id}, {language})\n"
        "Available: {available} tokens\n"
        "{charges}\n"
        "\n"
        "{text}\n"
        "\n"
        "<i>Reply to this message to answer.</i>"
    ),
    "support_card_charge": "• {pack} · {price} ⭐ · <code>{charge_id}</code>{refunded}",
    "support_card_stray": "• not credited · {price} ⭐ · <code>{charge_id}</code> · {state}",
    "support_reply": ("💬 <b>Support</b>:\n{text}"),
    "support_reply_sent": "✅ Sent to {name}.",
    "support_reply_failed": "The buyer could not be reached ({error}).",
    "refund_confirm": (
        "<b>Refund charge</b> <code>{charge_id}</code>?\n"
        "User {telegram_id} · {pack} · {price} ⭐ · {tokens} tokens · {time}\n"
        "The buyer has {available} tokens available. Telegram refunds all {price} ⭐; "
        "the books then remove {reversible} tokens, and {spent} already spent stay spent."
    ),
    "button_refund_yes": "Refund {price} ⭐",
    "refund_cancelled": "Refund cancelled; nothing was changed.",
    "refund_outcome_unknown": (
        "Telegram did not confirm the refund of <code>{charge_id}</code> ({error}) and "
        "does not list it yet. The books are unchanged; send /refund again in a "
        "minute: a repeat is safe."
    ),
    "refund_stray_done": (
        "Charge <code>{charge_id}</code> of user {telegram_id} ({price} ⭐, {time}) was "
        "never credited ({reason}); it was refunded at {refunded}."
    ),
    "refund_stray_now": (
        "Charge <code>{charge_id}</code> of user {telegram_id} ({price} ⭐, {time}) was "
        "never credited ({reason}); it is refunded now."
    ),
    "refund_stray_busy": (
        "The refund of charge <code>{charge_id}</code> is under way right now; try "
        "again in a minute."
    ),
    "language_choose": "Choose the bot's language:",
    "language_set": "Language: {name}.",
    "menu_updated": "The menu is updated.",
    "button_claim": "↩️ Ask to refund {pack} ({price} ⭐)",
    "claim_unknown": "That purchase is not yours or no longer exists.",
    "claim_already": "The payment <code>{charge_id}</code> has been refunded already.",
    "claim_sent": (
        "Your refund request for <code>{charge_id}</code> was passed to the operators; "
        "their answer will come here."
    ),
    "claim_reason_window": "past the refund window",
    "claim_reason_used": "tokens of the pack were used",
    "claim_reason_referral": "the purchase paid a referral reward",
    "operator_claim": (
        "↩️ <b>Refund request</b> from {name} (id {telegram_id})\n"
        "Charge <code>{charge_id}</code> · {pack} · {price} ⭐ · {tokens} tokens · {time}\n"
        "Available: {available} tokens; a refund leaves {spent} spent.\n"
        "Not refunded automatically: {reasons}.\n"
        "<i>Refund with the button, or reply to this message to answer.</i>"
    ),
    "operator_claim_refunded": (
        "↩️ Refunded under the terms' rule: charge <code>{charge_id}</code> of user "
        "{telegram_id}, {price} ⭐, {tokens} tokens removed."
    ),
    # Model prices, under /help and /terms: from the settings the API bills with.
    "prices": "<b>Prices</b> (balance tokens per token, prompt / completion where they differ)",
    "price_line": "• <code>{model}</code>: {price}",
    "prices_flat": "<b>Prices</b>: every model costs 1 balance token per token.",
    # Monthly plans (Telegram Stars subscriptions).
    "command_plan": "My monthly plan",
    "packs_plans": (
        "🔁 Plans renew every 30 days until you cancel them under /plan; unused tokens carry over."
    ),
    "plan_button": "🔁 {title} · {tokens} tokens/month · {price} ⭐/month",
    "terms_prompt_plans": (
        "• A plan is charged every 30 days until you cancel it (/plan); each charge adds "
        "the plan's tokens, and unused tokens carry over. A cancelled plan runs to the "
        "end of the period paid for."
    ),
    "terms_plans": (
        "6. Plans: a plan is charged in Telegram Stars every 30 days until you cancel it "
        "under /plan. Each charge credits the plan's tokens once; unused tokens carry "
        "over to the next period and do not expire. Cancelling stops the next charge, and "
        "the period already paid runs to its end. A renewal Telegram does not charge adds "
        "nothing. Each charge can be refunded like a pack's payment (point 3)."
    ),
    "plan_invoice_title": "{title}: {tokens}/month",
    "plan_invoice_description": (
        "{tokens} tokens for the OpenAI-compatible API every 30 days, charged in Stars "
        "until you cancel under /plan. Unused tokens carry over."
    ),
    "plan_invoice_label": "{tokens} tokens every 30 days",
    "plan_invoice": (
        "🔁 <b>{title}</b>: {tokens} tokens every 30 days for {price} ⭐. Tap below to "
        "subscribe; cancel any time under /plan."
    ),
    "button_subscribe": "⭐ Subscribe for {price} ⭐/month",
    "plan_unknown": "That plan is no longer sold. Here are the current packs and plans.",
    "plan_line": (
        "🔁 <b>{title}</b> · {tokens} tokens every 30 days · {price} ⭐ · renewals so far: "
        "{renewals}\n{state}"
    ),
    "plan_state_renews": "Next renewal: {date}, {price} ⭐.",
    "plan_state_canceled": "Cancelled: it runs until {date} and does not renew.",
    "plan_state_ended": "Ended {date}.",
    "plans_none": "You have no running plan. A plan adds its tokens every 30 days:",
    "plans_off": "This shop sells no monthly plans at the moment; /buy shows the packs.",
    "button_plan_cancel": "Cancel renewal",
    "button_plan_resume": "Resume renewal",
    "plan_canceled": (
        "The plan {plan} will not renew. It runs until {date}; you can resume it until then."
    ),
    "plan_resumed": "The plan {plan} renews again on {date}.",
    "plan_gone": "That plan is not yours or no longer exists.",
    "plan_over": "That plan has ended; subscribe again under /buy.",
    "plan_pending": (
        "This plan's first payment is still being matched with Telegram's records; try "
        "again in an hour."
    ),
    "plan_edit_failed": "Telegram refused the change ({error}). Nothing was changed.",
    "payment_plan_started": (
        "✅ Plan {plan} is active: +{tokens} tokens.\n"
        "Available now: {available} tokens.\n"
        "Next renewal: {date}, {price} ⭐; cancel any time under /plan."
    ),
    "payment_plan_renewed": (
        "🔁 Plan {plan} renewed: +{tokens} tokens (unused tokens carried over).\n"
        "Available now: {available} tokens.\n"
        "Next renewal: {date}, {price} ⭐."
    ),
    "plan_reminder": (
        "🔁 Your plan {plan} renews on {date}: {price} ⭐ for {tokens} more tokens; unused "
        "tokens carry over. To stop it, cancel under /plan."
    ),
    "paysupport_plan_charge": "🔁 {plan}",
    "stats_plans": (
        "🔁 <b>Plans</b>: {active} running, {ending} of them cancelled\n"
        "Today: {today}\n"
        "All time: {total}"
    ),
    "stats_plans_block": (
        "{started} started · {renewals} renewals · {cancellations} cancelled · {ended} "
        "ended · {revenue} ⭐"
    ),
}
