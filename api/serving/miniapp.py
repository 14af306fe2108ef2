"""The Mini App's work behind its routes: who the caller is, and each page's figures and actions
as billing's functions compute them (`billing.stats`, `billing.reports`, `billing.keys`...), one
short transaction each, on a worker thread. Routes stay thin; nothing here knows HTTP but the
`AppUser` the routes receive.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from anyio import to_thread
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from api.engine.protocol import EngineClient
from api.miniapp.auth import (
    InvalidSession,
    MissingCredentials,
    issue_session,
    read_session,
    verify_init_data,
)
from api.miniapp.telegram import BotApi
from api.protocol_miniapp import (
    BalanceOut,
    BuyersDayOut,
    HoldsOut,
    KeyIssued,
    KeyLimitsOut,
    KeyOut,
    Me,
    ModelSeries,
    OperatorOut,
    PackDayOut,
    PackOut,
    PlanOut,
    RefundsOut,
    SessionOut,
    ShopOut,
    StrayOut,
    SupportMessageOut,
    SupportOut,
    TopAccountOut,
    UpstreamOut,
    UsageOut,
    WaitingOut,
)
from api.settings import ApiSettings
from billing import (
    accounts,
    key_limits,
    keys,
    ledger,
    referrals,
    reports,
    stats,
    stray_charges,
    support,
)
from billing.db import reading, session_scope
from billing.errors import TermsNotAccepted
from billing.key_limits import KeyReport
from billing.models import ApiKey, Order, SupportMessage, utcnow
from billing.packs import Pack, find_pack
from billing.plans import find_plan
from billing.purchases import create_order
from billing.stats import UsageRow

T = TypeVar("T")
SUPPORT_HISTORY = 50


@dataclass(frozen=True)
class AppUser:
    """The caller of an /app/api route, as its initData or session proved it."""

    telegram_id: int
    account_id: int
    operator: bool


@dataclass
class MiniApp:
    settings: ApiSettings
    db: Engine
    engines: Mapping[str, EngineClient]
    secret_key: bytes
    telegram: BotApi | None  # None without TELEGRAM_BOT_TOKEN: every route then answers 401

    async def _write(self, work: Callable[[Session], T]) -> T:
        def run() -> T:
            with session_scope(self.db) as session:
                return work(session)

        return await to_thread.run_sync(run)

    async def _read(self, work: Callable[[Session], T]) -> T:
        def run() -> T:
            with session_scope(reading(self.db)) as session:
                return work(session)

        return await to_thread.run_sync(run)

    # Who is calling.
    async def authenticate(self, authorization: str | None) -> AppUser:
        """The caller of `Authorization: tma <initData>` or `Bearer <session>`; raises an
        AppAuthError (a 401) for anything else."""
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        credentials = credentials.strip()
        if not credentials or scheme.lower() not in ("tma", "bearer"):
            raise MissingCredentials(
                "Open the app from Telegram: send 'Authorization: tma <initData>'."
            )
        if scheme.lower() == "tma":
            return (await self._sign_in(credentials))[0]
        session = read_session(credentials, secret_key=self.secret_key)
        return self._user(session.telegram_id, session.account_id)

    async def sign_in(self, init_data: str) -> SessionOut:
        """Exchange initData for a session token (and who the caller is)."""
        user, me = await self._sign_in(init_data)
        token, session = issue_session(
            secret_key=self.secret_key,
            telegram_id=user.telegram_id,
            account_id=user.account_id,
            lifetime=timedelta(seconds=self.settings.app_session_seconds),
        )
        return SessionOut(token=token, expires_at=session.expires_at, me=me)

    async def _sign_in(self, init_data: str) -> tuple[AppUser, Me]:
        if self.telegram is None:
            raise InvalidSession("The Mini App is not configured on this server.")
        token = self.settings.telegram_bot_token
        assert token is not None
        person = verify_init_data(
            init_data,
            bot_token=token.get_secret_value(),
            max_age=timedelta(seconds=self.settings.app_init_data_max_age_seconds),
        )

        def work(session: Session) -> tuple[Me, int]:
            # first contact here or in the bot, as the bot opens accounts: starter tokens, and
            # the key to use them with
            contact = referrals.open_account(
                session=session,
                telegram_id=person.id,
                name=person.full_name[:255] or None,
                language=person.language_code,
                starter_tokens=self.settings.starter_tokens,
            )
            account = contact.account
            assert account.id is not None
            if contact.starter_tokens:
                keys.ensure_key(
                    session=session,
                    account_id=account.id,
                    secret_key=self.secret_key,
                    defaults=self.settings.key_defaults(),
                )
            return Me(
                telegram_id=person.id,
                name=account.name,
                language=account.chosen_language or account.language,
                operator=person.id in self.settings.admin_telegram_ids,
                terms_accepted=account.terms_accepted_at is not None,
            ), account.id

        me, account_id = await self._write(work)
        return self._user(person.id, account_id), me

    def _user(self, telegram_id: int, account_id: int) -> AppUser:
        return AppUser(telegram_id, account_id, telegram_id in self.settings.admin_telegram_ids)

    async def me(self, user: AppUser) -> Me:
        def work(session: Session) -> Me:
            account = accounts.get_account(session=session, account_id=user.account_id)
            return Me(
                telegram_id=user.telegram_id,
                name=account.name,
                language=account.chosen_language or account.language,
                operator=user.operator,
                terms_accepted=account.terms_accepted_at is not None,
            )

        return await self._read(work)

    # The buyer's pages.
    async def balance(self, user: AppUser) -> BalanceOut:
        def work(session: Session) -> BalanceOut:
            found = ledger.get_balance(session=session, account_id=user.account_id)
            return BalanceOut(
                available=found.available,
                held=found.held,
                purchased=found.purchased,
                granted=found.granted,
                used=found.used,
                refunded=found.refunded,
            )

        return await self._read(work)

    async def usage(self, user: AppUser, days: int) -> UsageOut:
        since, window = _window(days)

        def work(session: Session) -> list[UsageRow]:
            return stats.daily_usage(session=session, since=since, account_id=user.account_id)

        return _series(window, await self._read(work))

    async def usage_csv(self, user: AppUser) -> str:
        def work(session: Session) -> str:
            return stats.usage_csv(session=session, account_id=user.account_id)

        return await self._read(work)

    async def send_usage_csv(self, user: AppUser) -> None:
        """The CSV export into the buyer's chat with the bot."""
        assert self.telegram is not None

        def work(session: Session) -> tuple[str, str | None]:
            account = accounts.get_account(session=session, account_id=user.account_id)
            data = stats.usage_csv(session=session, account_id=user.account_id)
            return data, account.chosen_language or account.language

        data, language = await self._read(work)
        await self.telegram.send_csv(user.telegram_id, data, language)

    async def keys(self, user: AppUser) -> list[KeyOut]:
        def work(session: Session) -> list[KeyOut]:
            return _keys_out(session, user.account_id)

        return await self._read(work)

    async def set_limits(self, user: AppUser, key_id: int, text: str) -> KeyOut:
        """Change a key's limits from the words the bot takes (billing.key_limits.parse);
        raises InvalidLimits with what was not understood, KeyNotFound for no live key."""

        def work(session: Session) -> KeyOut:
            clear, changes = key_limits.parse(text)
            key_limits.set_limits(
                session=session,
                account_id=user.account_id,
                key_id=key_id,
                clear=clear,
                changes=changes,
                now=utcnow(),
            )
            return next(k for k in _keys_out(session, user.account_id) if k.id == key_id)

        return await self._write(work)

    async def create_key(self, user: AppUser, name: str) -> KeyIssued:
        def work(session: Session) -> KeyIssued:
            row, key = keys.create_key(
                session=session,
                account_id=user.account_id,
                secret_key=self.secret_key,
                name=name,
                defaults=self.settings.key_defaults(),  # the operator's limits for new keys
            )
            return KeyIssued(key=_key_out(row, None, _report(session, row)), secret=key)

        return await self._write(work)

    async def rename_key(self, user: AppUser, key_id: int, name: str) -> KeyOut:
        def work(session: Session) -> KeyOut:
            row = keys.rename_key(
                session=session, account_id=user.account_id, key_id=key_id, name=name
            )
            used = stats.usage_by_key(session=session, account_id=user.account_id)
            return _key_out(row, used.get(row.id), _report(session, row))

        return await self._write(work)

    async def rotate_key(self, user: AppUser, key_id: int) -> KeyIssued:
        def work(session: Session) -> KeyIssued:
            key = keys.rotate_key(
                session=session,
                account_id=user.account_id,
                secret_key=self.secret_key,
                key_id=key_id,
            )
            digest = keys.hash_key(key)
            row = session.exec(select(ApiKey).where(col(ApiKey.key_hash) == digest)).one()
            return KeyIssued(key=_key_out(row, None, _report(session, row)), secret=key)

        return await self._write(work)

    async def revoke_key(self, user: AppUser, key_id: int) -> None:
        def work(session: Session) -> None:
            keys.key_of(  # raises KeyNotFound unless it is a live key of this account
                session=session,
                account_id=user.account_id,
                key_id=key_id,
                secret_key=self.secret_key,
            )
            keys.revoke_key(session=session, account_id=user.account_id, key_id=key_id)

        await self._write(work)

    async def shop(self, user: AppUser) -> ShopOut:
        me = await self.me(user)
        return ShopOut(
            packs=[
                PackOut(id=p.id, title=p.title, tokens=p.tokens, price=p.price)
                for p in self.settings.catalog()
            ],
            plans=[
                PlanOut(
                    id=p.id,
                    title=p.title,
                    tokens=p.tokens,
                    price=p.price,
                    period_days=p.period_seconds // 86_400,
                )
                for p in self.settings.plan_catalog()
            ],
            terms_accepted=me.terms_accepted,
        )

    async def accept_terms(self, user: AppUser) -> None:
        def work(session: Session) -> None:
            accounts.accept_terms(session=session, account_id=user.account_id)

        await self._write(work)

    async def invoice_link(
        self, user: AppUser, pack_id: str | None = None, plan_id: str | None = None
    ) -> str:
        """An order for the pack (or the monthly plan) and its Stars invoice link (a plan's is a
        subscription's, docs/plans.md); the bot credits every payment."""
        assert self.telegram is not None  # authenticate() refused every caller otherwise
        pack: Pack = (
            find_plan(self.settings.plan_catalog(), plan_id)
            if plan_id is not None
            else find_pack(self.settings.catalog(), pack_id or "")
        )

        def work(session: Session) -> tuple[Order, str | None]:
            account = accounts.get_account(session=session, account_id=user.account_id)
            if account.terms_accepted_at is None:
                raise TermsNotAccepted("Accept the terms before buying.")
            order = create_order(session=session, account_id=user.account_id, pack=pack)
            return order, account.chosen_language or account.language

        order, language = await self._write(work)
        return await self.telegram.invoice_link(order, language)

    async def support(self, user: AppUser) -> SupportOut:
        def work(session: Session) -> list[SupportMessage]:
            return list(
                session.exec(
                    select(SupportMessage)
                    .where(col(SupportMessage.account_id) == user.account_id)
                    .order_by(col(SupportMessage.id).desc())
                    .limit(SUPPORT_HISTORY)
                ).all()
            )

        rows = await self._read(work)
        return SupportOut(
            messages=[
                SupportMessageOut(
                    from_operator=row.operator_id is not None, text=row.text, at=row.created_at
                )
                for row in reversed(rows)
            ]
        )

    async def write_support(self, user: AppUser, text: str) -> int:
        """Record the buyer's message and show it to every operator in the bot's chat, each copy
        recorded, so an operator's reply there reaches the buyer as the bot's support does."""
        assert self.telegram is not None

        def record(session: Session) -> tuple[int, support.BuyerContext]:
            saved = support.record_message(session=session, account_id=user.account_id, text=text)
            assert saved.id is not None
            return saved.id, support.context_of(session=session, account_id=user.account_id)

        message_id, buyer = await self._write(record)
        card = _operator_card(user, buyer, text)
        delivered: list[tuple[int, int]] = []
        for operator_id in sorted(self.settings.admin_telegram_ids):
            sent = await self.telegram.send(operator_id, card)
            if sent is not None:
                delivered.append((operator_id, sent))

        def copies(session: Session) -> None:
            for chat_id, sent_id in delivered:
                support.record_copy(
                    session=session,
                    support_message_id=message_id,
                    chat_id=chat_id,
                    message_id=sent_id,
                )

        await self._write(copies)
        return len(delivered)

    # The operator's page.
    async def operator(self, days: int) -> OperatorOut:
        since, window = _window(days)

        def work(session: Session) -> OperatorOut:
            sales = reports.sales_by_day(session=session, since=since)
            holds = reports.open_holds(session=session)
            return OperatorOut(
                days=window,
                revenue=sum(row.stars for row in sales),
                sales=[PackDayOut(**vars(row)) for row in sales],
                refunds=[
                    RefundsOut(**vars(row))
                    for row in reports.refunds_by_day(session=session, since=since)
                ],
                buyers=[
                    BuyersDayOut(**vars(row))
                    for row in reports.buyers_by_day(session=session, since=since)
                ],
                usage=_series(window, stats.daily_usage(session=session, since=since)),
                top_accounts=[
                    TopAccountOut(**vars(row))
                    for row in reports.top_accounts(session=session, since=since)
                ],
                stray_charges=[
                    StrayOut(
                        charge_id=row.telegram_payment_charge_id,
                        telegram_id=row.telegram_id,
                        stars=row.amount,
                        reason=row.reason,
                        at=row.created_at,
                        error=row.refund_error,
                    )
                    for row in stray_charges.unrefunded(session=session)
                ],
                support_queue=[
                    WaitingOut(**vars(row)) for row in reports.support_queue(session=session)
                ],
                open_holds=HoldsOut(**vars(holds)),
                upstreams=[],
            )

        figures = await self._read(work)
        figures.upstreams = [
            UpstreamOut(model=name, url=backend.url, up=backend.up, in_flight=backend.in_flight)
            for name, engine in self.engines.items()
            for backend in engine.backends()
        ]
        return figures


def _window(days: int) -> tuple[datetime, list[str]]:
    """The window's first instant (midnight UTC, `days - 1` days ago) and each of its days."""
    first = stats.start_of_day() - timedelta(days=days - 1)
    return first, [f"{first + timedelta(days=n):%Y-%m-%d}" for n in range(days)]


def _series(window: list[str], rows: list[UsageRow]) -> UsageOut:
    """Rows of (day, model) spread over every day of the window, one series per model."""
    index = {day: n for n, day in enumerate(window)}
    by_model: dict[str, ModelSeries] = {}
    for row in rows:
        if row.day not in index:
            continue
        series = by_model.setdefault(
            row.model,
            ModelSeries(
                model=row.model,
                prompt=[0] * len(window),
                completion=[0] * len(window),
                charged=[0] * len(window),
                requests=[0] * len(window),
            ),
        )
        at = index[row.day]
        series.prompt[at] += row.prompt_tokens
        series.completion[at] += row.completion_tokens
        series.charged[at] += row.charged
        series.requests[at] += row.requests
    return UsageOut(days=window, models=sorted(by_model.values(), key=lambda s: s.model))


def _keys_out(session: Session, account_id: int) -> list[KeyOut]:
    """The account's live keys, oldest first, each with its usage and limits."""
    live = keys.live_keys(session=session, account_id=account_id)
    used = stats.usage_by_key(session=session, account_id=account_id)
    reports = {
        key.id: report
        for key, report in key_limits.reports(session=session, account_id=account_id, now=utcnow())
    }
    return [_key_out(row, used.get(row.id), reports.get(row.id)) for row in live]


def _report(session: Session, row: ApiKey) -> KeyReport | None:
    assert row.id is not None
    return key_limits.report(session=session, key_id=row.id, now=utcnow())


def _key_out(row: ApiKey, usage: stats.KeyUsage | None, report: KeyReport | None) -> KeyOut:
    assert row.id is not None
    limits = None
    if report is not None:
        limits = KeyLimitsOut(
            spend=report.limits.spend,
            period=report.limits.period,
            spent=report.spent,
            held=report.held,
            remaining=report.remaining,
            resets_at=report.resets_at if report.limits.spend is not None else None,
            expires_at=report.limits.expires_at,
            models=list(report.limits.models),
            rpm=report.limits.rpm,
            tpm=report.limits.tpm,
        )
    return KeyOut(
        id=row.id,
        name=row.name,
        masked=f"{keys.KEY_PREFIX}…{row.hint}",
        created_at=row.created_at,
        requests=usage.requests if usage else 0,
        charged=usage.charged if usage else 0,
        limits=limits,
    )


def _operator_card(user: AppUser, buyer: support.BuyerContext, text: str) -> str:
    """The message operators get, in the bot's shape: who, their balance and charges, the text;
    a reply to it in Telegram answers the buyer (the bot finds them by the recorded copy)."""
    charges = [
        f"• {html.escape(p.pack_title)}: {p.price} ⭐ "
        f"<code>{html.escape(p.telegram_payment_charge_id)}</code>"
        + (" (refunded)" if p.refunded_at else "")
        for p in buyer.purchases
    ]
    name = html.escape(buyer.account.name or "")
    return (
        f"💬 <b>Support message</b> from {name} (id {user.telegram_id}, via the Mini App)\n"
        f"Available: {buyer.available:,} tokens\n"
        + ("\n".join(charges) or "No purchases yet.")
        + f"\n\n{html.escape(text)}\n\n<i>Reply to this message to answer.</i>"
    )
