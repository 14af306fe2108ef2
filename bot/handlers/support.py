"""`/help`, `/terms`, `/privacy` and `/paysupport` (Telegram requires the last three of bots that
sell digital goods), support inside the bot, and the replies to anything it does not understand.

A buyer writes to support with `/paysupport <text>`, or with the next plain message after
`/paysupport` or the Support button (the account remembers the prompt, so any bot process
takes it), or as a reply to the prompt; the message reaches every operator with the buyer's
charges and balance, and an operator's reply to it (Telegram's reply) goes back to the buyer.
It works without any `SUPPORT_CONTACT`; that contact, when set, is offered besides.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta

from sqlmodel import Session
from telegram import ForceReply, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from billing import stray_charges, support
from billing.models import Account, Purchase, StrayCharge, utcnow
from billing.purchases import recent_purchases
from bot import keyboards
from bot.runtime import account_of, lang, runtime
from bot.texts import LANGUAGES, Html, Lang, language_for, lines, number, plain, t, when

logger = logging.getLogger(__name__)

RECENT_CHARGES = 10
REFUND_BUTTONS = 3  # refund requests offered for the newest charges


async def show_help(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    language = lang(update, context)
    text = lines([t(language, "help"), Html(""), prices(language, context)])
    await update.effective_message.reply_text(text, reply_markup=keyboards.main_menu(language))


async def show_terms(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    language = lang(update, context)
    days = runtime(context).settings.refund_window_days
    terms = [t(language, "terms", days=days)]
    if runtime(context).plans:
        terms.append(t(language, "terms_plans"))
    text = lines([*terms, Html(""), prices(language, context)])
    await update.effective_message.reply_text(text)


def prices(language: Lang, context: ContextTypes.DEFAULT_TYPE) -> Html:
    """Each priced model's price, read from MODELS_FILE and MODEL_PRICES as the API reads them."""
    table = runtime(context).settings.prices()
    if not table:
        return t(language, "prices_flat")
    rows = [
        t(language, "price_line", model=name, price=price.describe())
        for name, price in table.items()
    ]
    return lines([t(language, "prices"), *rows])


async def show_privacy(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    await update.effective_message.reply_text(t(lang(update, context), "privacy"))


async def pay_support(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The buyer's recent charges (stray ones too), with the ids a refund request needs, and the
    way to write to the operators; `/paysupport <text>` sends the text at once."""
    assert update.effective_message is not None
    if context.args:
        text = (update.effective_message.text or "").partition(" ")[2].strip()
        await _to_operators(update, context, text)
        return
    account = await account_of(update, context)
    assert account.id is not None and account.telegram_id is not None
    account_id, telegram_id = account.id, account.telegram_id

    def work(session: Session) -> tuple[list[Purchase], list[StrayCharge]]:
        return (
            recent_purchases(session=session, account_id=account_id, limit=RECENT_CHARGES),
            stray_charges.of_user(session=session, telegram_id=telegram_id, limit=RECENT_CHARGES),
        )

    purchases, strays = await runtime(context).read(work)
    await _open_prompt(context, account_id)
    language = lang(update, context)
    listed = [
        t(
            language,
            "paysupport_line",
            time=when(purchase.created_at),
            pack=(
                t(language, "paysupport_plan_charge", plan=purchase.pack_title)
                if purchase.subscription_id is not None
                else purchase.pack_title
            ),
            price=purchase.price,
            charge_id=purchase.telegram_payment_charge_id,
            refunded=t(language, "paysupport_refunded") if purchase.refunded_at else Html(""),
        )
        for purchase in purchases
    ] + [
        t(
            language,
            "paysupport_stray_line",
            time=when(stray.created_at),
            price=stray.amount,
            charge_id=stray.telegram_payment_charge_id,
            state=t(
                language,
                "paysupport_stray_refunded" if stray.refunded_at else "paysupport_stray_pending",
            ),
        )
        for stray in strays
    ]
    settings = runtime(context).settings
    since = utcnow() - timedelta(days=settings.refund_window_days)
    refundable = [
        (purchase.id, purchase.pack_title, purchase.price)
        for purchase in purchases
        if purchase.id is not None and purchase.refunded_at is None and purchase.created_at >= since
    ][:REFUND_BUTTONS]
    contact = (
        t(language, "paysupport_contact", contact=settings.support_contact)
        if settings.support_contact
        else Html("")
    )
    await update.effective_message.reply_text(
        t(
            language,
            "paysupport",
            purchases=lines(listed) if listed else t(language, "paysupport_none"),
            days=settings.refund_window_days,
            contact=contact,
        ),
        reply_markup=keyboards.write_to_support(language, refundable),
    )


async def ask(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The Support button: ask for the message, the next one the buyer sends (or a reply to
    this prompt)."""
    assert update.effective_message is not None
    if update.callback_query is not None:
        await update.callback_query.answer()
    account = await account_of(update, context)
    assert account.id is not None
    await _open_prompt(context, account.id)
    await update.effective_message.reply_text(
        t(lang(update, context), "support_prompt"),
        reply_markup=ForceReply(input_field_placeholder="…"),
    )


async def _open_prompt(context: ContextTypes.DEFAULT_TYPE, account_id: int) -> None:
    def work(session: Session) -> None:
        support.open_prompt(session=session, account_id=account_id)

    await runtime(context).run(work)


async def on_text(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A plain message: for the operators when it answers a support prompt, else the help."""
    message = update.effective_message
    assert message is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def take(session: Session) -> bool:
        return support.answers_prompt(session=session, account_id=account_id)

    if await runtime(context).run(take):
        await _to_operators(update, context, message.text or "")
        return
    await fallback(update, context)


def _is_prompt(text: str | None) -> bool:
    """The support prompt, or an operator's answer (a reply to it continues the thread)."""
    if text is None:
        return False
    answers = {_plain_html(plain(code, "support_reply", text="")) for code in LANGUAGES}
    return text in {plain(code, "support_prompt") for code in LANGUAGES} or any(
        text.startswith(answer) for answer in answers
    )


def _plain_html(text: str) -> str:
    """A text as the client shows it (and sends it back in reply_to_message): tags removed."""
    return re.sub(r"<[^>]+>", "", text)


async def on_reply(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A reply to one of the bot's messages: an operator answering a buyer's message, or a
    buyer answering the support prompt; anything else gets the help."""
    message = update.effective_message
    assert message is not None and message.reply_to_message is not None
    assert update.effective_user is not None
    shop = runtime(context)
    replied = message.reply_to_message
    if update.effective_user.id in shop.settings.admin_telegram_ids:
        operator_id = update.effective_user.id
        chat_id, message_id = message.chat_id, replied.message_id

        def find(session: Session) -> Account | None:
            return support.buyer_of_copy(session=session, chat_id=chat_id, message_id=message_id)

        buyer = await shop.read(find)
        if buyer is not None:
            await _to_buyer(update, context, buyer, operator_id)
            return
    if _is_prompt(replied.text):
        await _to_operators(update, context, message.text or "")
        return
    await fallback(update, context)


async def _to_operators(update: Update, context: ContextTypes.DEFAULT_TYPE, text: str) -> None:
    """Record the buyer's message and show it, with their charges and balance, to every
    operator; each copy is recorded so that a reply to it finds the buyer."""
    message = update.effective_message
    assert message is not None and update.effective_user is not None
    language = lang(update, context)
    if not text.strip():
        await ask(update, context)
        return
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def record(session: Session) -> tuple[int, support.BuyerContext]:
        saved = support.record_message(session=session, account_id=account_id, text=text)
        assert saved.id is not None
        return saved.id, support.context_of(session=session, account_id=account_id)

    message_id, buyer = await shop.run(record)
    card = _operator_card(update, buyer, text)
    delivered: list[tuple[int, int]] = []
    for operator_id in sorted(shop.settings.admin_telegram_ids):
        try:
            sent = await context.bot.send_message(operator_id, card)
        except TelegramError:
            logger.warning("could not pass a support message to %s", operator_id, exc_info=True)
            continue
        delivered.append((operator_id, sent.message_id))

    def copies(session: Session) -> None:
        for chat_id, sent_id in delivered:
            support.record_copy(
                session=session, support_message_id=message_id, chat_id=chat_id, message_id=sent_id
            )

    await shop.run(copies)
    await message.reply_text(t(language, "support_sent" if delivered else "support_unreachable"))


def _operator_card(update: Update, buyer: support.BuyerContext, text: str) -> Html:
    user = update.effective_user
    assert user is not None
    charges = [
        t(
            "en",
            "support_card_charge",
            pack=purchase.pack_title,
            price=purchase.price,
            charge_id=purchase.telegram_payment_charge_id,
            refunded=t("en", "paysupport_refunded") if purchase.refunded_at else Html(""),
        )
        for purchase in buyer.purchases
    ] + [
        t(
            "en",
            "support_card_stray",
            price=stray.amount,
            charge_id=stray.telegram_payment_charge_id,
            state="refunded" if stray.refunded_at else "NOT refunded yet",
        )
        for stray in buyer.strays
    ]
    return t(
        "en",
        "support_card",
        name=user.full_name,
        username=f" @{user.username}" if user.username else "",
        telegram_id=user.id,
        language=user.language_code or "—",
        available=number("en", buyer.available),
        charges=lines(charges) if charges else t("en", "paysupport_none"),
        text=text,
    )


async def _to_buyer(
    update: Update, context: ContextTypes.DEFAULT_TYPE, buyer: Account, operator_id: int
) -> None:
    message = update.effective_message
    assert message is not None and buyer.id is not None and buyer.telegram_id is not None
    text = message.text or ""
    account_id = buyer.id
    shop = runtime(context)

    def record(session: Session) -> None:
        support.record_message(
            session=session, account_id=account_id, text=text, operator_id=operator_id
        )

    await shop.run(record)
    language = language_for(
        shop.languages.get(buyer.telegram_id) or buyer.chosen_language or buyer.language
    )
    try:
        await context.bot.send_message(
            buyer.telegram_id,
            t(language, "support_reply", text=text),
            reply_markup=keyboards.write_to_support(language),
        )
    except TelegramError as error:
        await message.reply_text(
            t(lang(update, context), "support_reply_failed", error=error.message)
        )
        return
    await message.reply_text(t(lang(update, context), "support_reply_sent", name=buyer.name or ""))


async def unknown_command(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Every command nobody handled, operator commands sent by others included: the same reply,
    so the operator commands do not reveal themselves."""
    assert update.effective_message is not None
    await update.effective_message.reply_text(t(lang(update, context), "unknown_command"))


async def fallback(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    language = lang(update, context)
    await update.effective_message.reply_text(
        t(language, "help"), reply_markup=keyboards.main_menu(language)
    )
