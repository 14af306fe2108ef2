"""Telegram's initData check and the page's sessions, alone: what Telegram signs passes, anything
else is an AppAuthError (a 401 at the edge), never another exception."""

from __future__ import annotations

import time
from datetime import timedelta
from urllib.parse import parse_qsl, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.miniapp.auth import (
    AppAuthError,
    InvalidInitData,
    InvalidSession,
    StaleInitData,
    issue_session,
    read_session,
    verify_init_data,
)
from tests.api.miniapp.conftest import person, signed_init_data
from tests.bot.double import BOT_TOKEN

HOUR = timedelta(hours=1)
SECRET = b"a-secret-key-for-the-session-tests-0123456789"


def test_telegrams_signature_names_the_user():
    user = verify_init_data(
        signed_init_data(person(42, "Ada", "ru") | {"last_name": "L", "username": "ada"}),
        bot_token=BOT_TOKEN,
        max_age=HOUR,
    )
    assert (user.id, user.full_name, user.username, user.language_code) == (
        42,
        "Ada L",
        "ada",
        "ru",
    )


def test_the_signature_field_is_part_of_what_is_signed():
    fields = dict(parse_qsl(signed_init_data(person(42))))
    fields["signature"] = "another"
    with pytest.raises(InvalidInitData):
        verify_init_data(urlencode(fields), bot_token=BOT_TOKEN, max_age=HOUR)


@pytest.mark.parametrize(
    ("auth_date", "error"),
    [(time.time() - 3601, StaleInitData), (time.time() + 3600, InvalidInitData)],
    ids=["an hour old", "an hour ahead"],  # fixed: pytest-xdist's workers must collect alike
)
def test_old_or_future_init_data_is_refused(auth_date, error):
    with pytest.raises(error):
        verify_init_data(
            signed_init_data(person(42), auth_date=auth_date), bot_token=BOT_TOKEN, max_age=HOUR
        )


def test_a_repeated_field_is_refused():
    signed = signed_init_data(person(42))
    with pytest.raises(InvalidInitData):
        verify_init_data(f"{signed}&user=%7B%22id%22%3A1%7D", bot_token=BOT_TOKEN, max_age=HOUR)


@given(st.text(max_size=300))
def test_any_other_string_is_an_auth_error(text):
    with pytest.raises(AppAuthError):
        verify_init_data(text, bot_token=BOT_TOKEN, max_age=HOUR)
    with pytest.raises(AppAuthError):
        read_session(text, secret_key=SECRET)
    with pytest.raises(AppAuthError):
        read_session(f"tks-app.{text}", secret_key=SECRET)


def test_a_session_is_read_back_until_it_expires_and_only_under_its_key():
    token, session = issue_session(
        secret_key=SECRET, telegram_id=42, account_id=7, lifetime=timedelta(minutes=15)
    )
    assert read_session(token, secret_key=SECRET) == session
    with pytest.raises(InvalidSession):
        read_session(token, secret_key=b"another-secret-key-0123456789-0123456789")
    with pytest.raises(InvalidSession, match="expired"):
        read_session(token, secret_key=SECRET, now=session.expires_at)
