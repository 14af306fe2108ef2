"""The support prompt lives in the database: the buyer's next plain message answers it once,
in whichever bot process takes it first, and not after it lapsed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from billing import support
from billing.db import session_scope
from tests.factories import make_account

ASKED = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def test_the_next_message_answers_the_prompt_once(engine: Engine) -> None:
    with session_scope(engine) as session:
        account_id = make_account(session).id
        assert account_id is not None
        support.open_prompt(session=session, account_id=account_id, now=ASKED)
    later = ASKED + timedelta(minutes=5)
    with session_scope(engine) as first:
        taken = support.answers_prompt(session=first, account_id=account_id, now=later)
    with session_scope(engine) as second:
        again = support.answers_prompt(session=second, account_id=account_id, now=later)
    assert (taken, again) == (True, False)


def test_a_prompt_lapses_after_its_lifetime(engine: Engine) -> None:
    with session_scope(engine) as session:
        account_id = make_account(session).id
        assert account_id is not None
        support.open_prompt(session=session, account_id=account_id, now=ASKED)
        lapsed = ASKED + support.PROMPT_LIFETIME + timedelta(seconds=1)
        assert not support.answers_prompt(session=session, account_id=account_id, now=lapsed)


def test_a_message_sent_another_way_closes_the_prompt(engine: Engine) -> None:
    with session_scope(engine) as session:
        account_id = make_account(session).id
        assert account_id is not None
        support.open_prompt(session=session, account_id=account_id, now=ASKED)
        support.record_message(session=session, account_id=account_id, text="via /paysupport")
        assert not support.answers_prompt(session=session, account_id=account_id, now=ASKED)
