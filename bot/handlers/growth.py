"""Growth: promo codes a buyer redeems (`/promo <code>`) and the buyer's referral link
(`/invite`), which pays them a share of each invited buyer's first purchase."""

from __future__ import annotations

from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing import keys, ledger, promos, referrals
from billing.errors import PromoError
from bot.runtime import account_of, lang, runtime
from bot.texts import number, t

PROMO_REASONS = ("unknown", "expired", "used_up", "already")


async def redeem_promo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    message = update.effective_message
    assert message is not None
    language = lang(update, context)
    args = context.args or []
    if len(args) != 1:
        await message.reply_text(t(language, "promo_usage"))
        return
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> tuple[promos.Redeemed, int]:
        redeemed = promos.redeem(session=session, account_id=account_id, code=args[0])
        keys.ensure_key(
            session=session,
            account_id=account_id,
            secret_key=shop.secret_key,
            defaults=shop.settings.key_defaults(),
        )
        return redeemed, ledger.get_balance(session=session, account_id=account_id).available

    try:
        redeemed, available = await shop.run(work)
    except PromoError as error:
        reason = error.reason if error.reason in PROMO_REASONS else "unknown"
        await message.reply_text(t(language, f"promo_{reason}"))
        return
    await message.reply_text(
        t(
            language,
            "promo_redeemed",
            code=redeemed.code,
            tokens=number(language, redeemed.tokens),
            available=number(language, available),
        )
    )


async def invite(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The buyer's referral link and what it has earned."""
    message = update.effective_message
    assert message is not None
    language = lang(update, context)
    shop = runtime(context)
    share = shop.settings.referral_share_percent
    if share <= 0:
        await message.reply_text(t(language, "invite_off"))
        return
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> tuple[str, int, int]:
        code = referrals.code_of(session=session, account_id=account_id)
        return (code, *referrals.counts(session=session, account_id=account_id))

    code, invited, earned = await shop.run(work)
    link = f"https://t.me/{context.bot.username}?start={referrals.LINK_PREFIX}{code}"
    await message.reply_text(
        t(
            language,
            "invite",
            link=link,
            share=share,
            invited=invited,
            earned=number(language, earned),
        )
    )
