"""A key's limits in the books: periods that reset at UTC boundaries (under a clock the test
moves), holds of many connections at once never reserving past a spend limit, a limit set
mid-period counting what the key already spent, the audit catching a key spend the ledger does
not back, and the operator's `tokenshop keys limit` and `keys list`."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, update
from sqlmodel import Session

from billing import key_limits, keys, ledger
from billing.db import session_scope
from billing.errors import InvalidLimits, KeyLimitReached, KeyRateLimited
from billing.key_limits import Limits, parse, period_start, resets_at
from billing.models import KeyLimit
from tests.factories import limit_key, make_account

TTL = timedelta(minutes=5)
_ids = itertools.count()


def funded_key(engine: Engine, secret_key: bytes, tokens: int = 1_000_000) -> tuple[int, int]:
    """A key of an account holding `tokens`: its account id and key id."""
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=tokens)
        assert account.id is not None
        row, _ = keys.create_key(session=writer, account_id=account.id, secret_key=secret_key)
        writer.commit()
        assert row.id is not None
        return account.id, row.id


def hold(
    engine: Engine, account_id: int, key_id: int, tokens: int, now: datetime | None = None
) -> str:
    request_id = f"req-{next(_ids)}"
    with session_scope(engine) as session:
        ledger.hold(
            session=session,
            account_id=account_id,
            request_id=request_id,
            min_tokens=tokens,
            max_tokens=tokens,
            ttl=TTL,
            key_id=key_id,
            now=now,
        )
    return request_id


def settle(engine: Engine, request_id: str, cost: int) -> None:
    with session_scope(engine) as session:
        ledger.settle(session=session, hold_id=request_id, cost=cost)


def test_periods_start_at_utc_midnight_monday_and_the_first() -> None:
    now = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)  # a Thursday
    assert period_start("daily", now) == datetime(2026, 12, 31, tzinfo=UTC)
    assert period_start("weekly", now) == datetime(2026, 12, 28, tzinfo=UTC)
    assert period_start("monthly", now) == datetime(2026, 12, 1, tzinfo=UTC)
    assert resets_at("daily", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert resets_at("weekly", now) == datetime(2027, 1, 4, tzinfo=UTC)
    assert resets_at("monthly", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert resets_at("total", now) is None
    moscow = datetime(2027, 1, 1, 1, 0, tzinfo=UTC) + timedelta(hours=3)  # still the 1st, UTC
    assert period_start("daily", moscow.astimezone(UTC)) == datetime(2027, 1, 1, tzinfo=UTC)


def test_limits_are_read_as_a_person_writes_them() -> None:
    clear, changes = parse("spend 500 daily; rpm 60; tpm=9000\nmodels a, b; expires 2027-01-31")
    assert not clear
    assert changes == {
        "spend": 500,
        "period": "daily",
        "rpm": 60,
        "tpm": 9000,
        "models": ("a", "b"),
        "expires_at": datetime(2027, 1, 31, tzinfo=UTC),
    }
    assert parse("clear; rpm off") == (True, {"rpm": None})
    for bad in ("spend 5 yearly", "rpm 0", "speed 3", "expires tomorrow"):
        with pytest.raises(InvalidLimits):
            parse(bad)
    with pytest.raises(InvalidLimits):
        Limits(spend=-1)


def test_sixty_four_holds_at_once_never_reserve_past_the_keys_limit(
    engine: Engine, secret_key: bytes
) -> None:
    account_id, key_id = funded_key(engine, secret_key)
    now = datetime.now(UTC)
    limit_key(engine, account_id, key_id, "spend 500 daily", now)
    start = threading.Barrier(64)

    def one(_: int) -> int:
        start.wait(timeout=30)
        try:
            hold(engine, account_id, key_id, 30)
        except KeyLimitReached:
            return 0
        return 30

    with ThreadPoolExecutor(max_workers=64) as pool:
        reserved = sum(pool.map(one, range(64)))

    assert reserved == 480  # sixteen holds of 30 fit in 500, the seventeenth does not
    with session_scope(engine) as session:
        report = key_limits.report(session=session, key_id=key_id, now=now)
        assert report is not None and report.held == 480 and report.remaining == 20
        assert ledger.audit(session=session) == []


def test_a_daily_limit_resets_at_midnight_and_a_late_request_counts_in_its_own_day(
    engine: Engine, secret_key: bytes
) -> None:
    account_id, key_id = funded_key(engine, secret_key)
    evening = datetime(2026, 11, 28, 23, 59, tzinfo=UTC)
    limit_key(engine, account_id, key_id, "spend 100 daily", evening)
    settle(engine, hold(engine, account_id, key_id, 60, now=evening), 60)
    late = hold(engine, account_id, key_id, 40, now=evening)  # still running at midnight
    with pytest.raises(KeyLimitReached) as refused:
        hold(engine, account_id, key_id, 1, now=evening)
    assert refused.value.resets_at == datetime(2026, 11, 29, tzinfo=UTC)

    morning = datetime(2026, 11, 29, 0, 0, 5, tzinfo=UTC)
    fresh = hold(engine, account_id, key_id, 60, now=morning)  # a new day: 100 again, less held
    settle(engine, late, 40)  # placed yesterday: yesterday's
    settle(engine, fresh, 60)

    with session_scope(engine) as session:
        report = key_limits.report(session=session, key_id=key_id, now=morning)
        assert report is not None
        assert (report.spent, report.held, report.spent_total) == (60, 0, 160)
        assert report.resets_at == datetime(2026, 11, 30, tzinfo=UTC)
        assert ledger.audit(session=session) == []


def test_a_limit_set_at_noon_counts_the_mornings_spend(engine: Engine, secret_key: bytes) -> None:
    account_id, key_id = funded_key(engine, secret_key)
    now = datetime.now(UTC)
    settle(engine, hold(engine, account_id, key_id, 300), 250)

    limit_key(engine, account_id, key_id, "spend 400 daily", now)

    with pytest.raises(KeyLimitReached):
        hold(engine, account_id, key_id, 151)
    settle(engine, hold(engine, account_id, key_id, 150), 150)
    with session_scope(engine) as session:
        report = key_limits.report(session=session, key_id=key_id, now=now)
        assert report is not None and report.spent == 400 and report.remaining == 0


def test_rpm_counts_requests_and_tpm_gives_back_what_a_hold_did_not_use(
    engine: Engine, secret_key: bytes
) -> None:
    account_id, key_id = funded_key(engine, secret_key)
    now = datetime(2026, 11, 28, 12, 0, 10, tzinfo=UTC)
    limit_key(engine, account_id, key_id, "rpm 2; tpm 100", now)
    first = hold(engine, account_id, key_id, 90, now=now)
    settle(engine, first, 10)  # 80 unused go back to the minute
    hold(engine, account_id, key_id, 50, now=now + timedelta(seconds=5))
    with pytest.raises(KeyRateLimited) as by_requests:
        hold(engine, account_id, key_id, 1, now=now + timedelta(seconds=20))
    assert (by_requests.value.kind, by_requests.value.retry_after) == ("requests", 40)

    limit_key(engine, account_id, key_id, "rpm off", now)
    with pytest.raises(KeyRateLimited) as by_tokens:
        hold(engine, account_id, key_id, 41, now=now + timedelta(seconds=30))  # 10 + 50 + 41
    assert by_tokens.value.kind == "tokens" and by_tokens.value.retry_after == 30
    hold(engine, account_id, key_id, 41, now=now + timedelta(seconds=61))  # a new minute


def test_the_audit_finds_a_key_spend_the_ledger_does_not_back(
    engine: Engine, secret_key: bytes, tokenshop
) -> None:
    account_id, key_id = funded_key(engine, secret_key)
    settle(engine, hold(engine, account_id, key_id, 50), 50)
    assert tokenshop("audit").stdout.strip() == "audit: ok"

    with session_scope(engine) as session:
        limit_id = session.get(keys.ApiKey, key_id).limit_id  # type: ignore[union-attr]
        session.execute(
            update(KeyLimit)
            .where(KeyLimit.id == limit_id)
            .values(spent_total=KeyLimit.spent_total - 20)
        )

    result = tokenshop("audit")
    assert result.returncode == 1
    assert f"key limit {limit_id}: spent 30 in all != ledger 50" in result.stdout


def test_the_operator_limits_and_lists_keys_from_the_command_line(
    engine: Engine, secret_key: bytes, tokenshop
) -> None:
    account_id, key_id = funded_key(engine, secret_key)
    settle(engine, hold(engine, account_id, key_id, 70), 70)

    limited = tokenshop(
        "keys", "limit", "--key-id", str(key_id), "--spend", "1000", "--period", "weekly",
        "--models", "demo,big", "--rpm", "30", "--expires", "2099-12-31",
    )  # fmt: skip
    listed = tokenshop("keys", "list", "--account", str(account_id))
    cleared = tokenshop("keys", "limit", "--key-id", str(key_id), "--clear", "--tpm", "500")
    wrong = tokenshop("keys", "limit", "--key-id", str(key_id), "--period", "yearly")
    nothing = tokenshop("keys", "limit", "--key-id", str(key_id))

    assert limited.returncode == 0, limited.stderr
    assert "spend 70/1000 weekly, resets" in limited.stdout
    assert "expires 2099-12-31 00:00 UTC; models demo,big; rpm 30" in limited.stdout
    assert listed.stdout.startswith(f"key {key_id}\tdefault (…")
    assert "spend 70/1000 weekly" in listed.stdout
    assert cleared.stdout.strip() == f"key {key_id}: spent 70, no spend limit; tpm 500"
    assert wrong.returncode == 2 and "period must be one of" in wrong.stderr
    assert nothing.returncode == 2 and "give at least one limit" in nothing.stderr
