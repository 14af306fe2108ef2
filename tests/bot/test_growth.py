"""Growth tools: promo codes (operator-made, each redeemed once per buyer, `uses` in all),
referral links (a share of the invited buyer's first purchase, once), starter tokens (off unless
the operator sets them), the language picker, and users who block the bot."""

from __future__ import annotations

import asyncio
import re

import pytest
from sqlmodel import Session, select
from telegram.ext import Application

from billing import ledger
from billing.models import LedgerEntry, PromoCode, PromoRedemption, Referral
from bot.jobs import send_balance_notices
from bot.runtime import runtime_of
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buttons, buy_pack

pytestmark = pytest.mark.anyio

STARTER = 100_000


def available(session: Session, user: TelegramUser) -> int:
    account = account_of(session, user)
    assert account.id is not None
    return ledger.get_balance(session=session, account_id=account.id).available


async def test_ten_buyers_racing_for_a_one_use_code_credit_it_once(
    shop_bot: Application,  # type: ignore[type-arg]
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    await operator.send("/promo_new launch 5000 1 7")
    assert "Promo code <code>LAUNCH</code>: 5,000 tokens, 1 uses" in telegram.last_text_to(
        operator.id
    )
    buyers = [TelegramUser(shop_bot, id=200_000 + n, first_name=f"B{n}") for n in range(10)]
    for buyer in buyers:
        await buyer.send("/start")

    await asyncio.gather(*(buyer.send("/promo LAUNCH") for buyer in buyers))

    session.rollback()
    grants = session.exec(select(LedgerEntry).where(LedgerEntry.note == "promo LAUNCH")).all()
    assert [entry.amount for entry in grants] == [5_000]
    assert len(session.exec(select(PromoRedemption)).all()) == 1
    assert session.exec(select(PromoCode)).one().uses == 1
    replies = [telegram.last_text_to(buyer.id) for buyer in buyers]
    assert sum("+5,000 tokens" in reply for reply in replies) == 1
    assert sum(reply == "This promo code has been used up." for reply in replies) == 9


async def test_a_buyer_redeems_a_code_once_and_an_expired_or_unknown_code_not_at_all(
    alice: TelegramUser,
    boris: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    await operator.send("/promo_new WELCOME 1000 100")
    await alice.send("/promo welcome")
    assert "Code WELCOME: +1,000 tokens. Available now: 1,000 tokens." in (
        telegram.last_text_to(alice.id)
    )
    await alice.send("/promo WELCOME")
    assert telegram.last_text_to(alice.id) == "You have already redeemed this promo code."
    await alice.send("/promo NOPE")
    assert telegram.last_text_to(alice.id) == "There is no such promo code."
    assert available(session, alice) == 1_000

    session.rollback()
    promo = session.exec(select(PromoCode).where(PromoCode.code == "WELCOME")).one()
    promo.expires_at = promo.created_at
    session.add(promo)
    session.commit()
    await operator.send("/promo_new BYE 10 5")
    await operator.send("/promos")
    assert "<code>WELCOME</code> · 1,000 tokens · used 1/100" in telegram.last_text_to(operator.id)
    await alice.send("/promo WELCOME")
    assert telegram.last_text_to(alice.id) == "You have already redeemed this promo code."
    await boris.send("/promo WELCOME")
    assert telegram.last_text_to(boris.id) == "Срок действия этого промокода истёк."
    await operator.send("/promo_new WELCOME 5 5")
    assert "exists already" in telegram.last_text_to(operator.id)


async def test_a_promo_code_from_someone_who_is_not_an_operator_is_not_created(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/promo_new FREE 1000000 1000")

    assert "I don't know that command" in telegram.last_text_to(alice.id)
    session.rollback()
    assert session.exec(select(PromoCode)).all() == []


async def test_a_referral_pays_a_share_of_the_first_purchase_once(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/invite")
    link = re.search(
        r"https://t\.me/tokenshop_test_bot\?start=(ref_\w+)", telegram.last_text_to(alice.id)
    )
    assert link is not None and "You get 10%" in telegram.last_text_to(alice.id)

    await boris.send(f"/start {link.group(1)}")
    await boris.send(f"/start {link.group(1)}")  # following the link again changes nothing
    assert "Вы пришли по приглашению" in telegram.texts_to(boris.id)[1]
    await buy_pack(boris, telegram, charge_id="charge-b1")
    await buy_pack(boris, telegram, charge_id="charge-b2")

    assert available(session, alice) == 10_000  # 10% of the first 100,000, once
    rewards = [text for text in telegram.texts_to(alice.id) if "Someone you invited" in text]
    assert rewards == ["🎁 Someone you invited made their first purchase: +10,000 tokens for you."]
    session.rollback()
    referral = session.exec(select(Referral)).one()
    assert (referral.share_percent, referral.reward_tokens) == (10, 10_000)
    await alice.send("/invite")
    assert "Invited: 1 · earned: 10,000 tokens" in telegram.last_text_to(alice.id)


async def test_a_buyer_cannot_refer_themselves_nor_be_referred_after_buying(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/invite")
    code = re.search(r"start=(ref_\w+)", telegram.last_text_to(alice.id))
    assert code is not None
    await buy_pack(boris, telegram, charge_id="charge-before")

    await alice.send(f"/start {code.group(1)}")
    await boris.send(f"/start {code.group(1)}")
    await buy_pack(boris, telegram, charge_id="charge-after")

    session.rollback()
    assert session.exec(select(Referral)).all() == []
    assert available(session, alice) == 0


async def test_starter_tokens_are_off_unless_the_operator_sets_them(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    boris: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    await alice.send("/start")
    assert available(session, alice) == 0

    settings = runtime_of(shop_bot.bot_data).settings
    runtime_of(shop_bot.bot_data).settings = settings.model_copy(update={"starter_tokens": 2_000})
    await boris.send("/start")
    await boris.send("/start")

    assert available(session, boris) == 2_000
    assert "2\u00a0000 токенов, чтобы попробовать API" in telegram.texts_to(boris.id)[1]
    await boris.send("/key")
    assert "<tg-spoiler>sk-tks-" in telegram.last_text_to(boris.id)


async def test_the_language_picker_overrides_the_clients_language(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/language")
    assert buttons(telegram) == ["lang:en", "lang:ru"]

    await alice.tap("lang:ru")
    assert telegram.last_text_to(alice.id) == "Меню обновлено."
    await alice.send("/help")
    assert "Как это работает" in telegram.last_text_to(alice.id)
    assert account_of(session, alice).chosen_language == "ru"


async def test_a_user_who_blocked_the_bot_gets_no_more_notices(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-block")
    await operator.send(f"/grant {alice.id} 1")  # an account with a balance that then runs out
    await operator.send("/refund charge-block")
    await operator.tap(next(data for data in buttons(telegram) if data.startswith("refund:p:")))
    await alice.block()
    assert account_of(session, alice).blocked_at is not None
    telegram.forget()

    assert await send_balance_notices(shop_bot) == []
    assert telegram.texts_to(alice.id) == []

    await alice.block(blocked=False)
    assert account_of(session, alice).blocked_at is None
    assert [notice.level for notice in await send_balance_notices(shop_bot)] == ["low"]
