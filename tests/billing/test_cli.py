"""Billing's `tokenshop` commands, run as the operator runs them: the installed command, a
process of its own (the `tokenshop` fixture in tests/conftest.py)."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from billing import keys
from billing.models import Account


def test_keys_issue_prints_a_working_key_as_its_last_line(tokenshop, engine):
    result = tokenshop("keys", "issue", "--tokens", "5000")
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip().splitlines()[-1]
    with Session(engine) as session:
        identity = keys.authenticate(session=session, key=key)
    assert "5000 tokens available" in result.stdout

    balance = tokenshop("balance", "--account", str(identity.account_id))
    assert "available 5000" in balance.stdout


def test_keys_issue_for_a_telegram_user_reuses_their_account(tokenshop, engine):
    first = tokenshop("keys", "issue", "--tokens", "100", "--telegram-id", "777")
    second = tokenshop("keys", "issue", "--tokens", "50", "--telegram-id", "777")
    assert first.stdout.splitlines()[-1] == second.stdout.splitlines()[-1]
    assert "150 tokens available" in second.stdout


def test_rotate_and_revoke(tokenshop, engine):
    old = tokenshop("keys", "issue", "--tokens", "1", "--telegram-id", "5").stdout.split()[-1]
    new = tokenshop("keys", "rotate", "--telegram-id", "5").stdout.strip()
    assert new != old and keys.is_well_formed(new)
    assert tokenshop("keys", "show", "--telegram-id", "5").stdout.strip() == new
    revoked = tokenshop("keys", "revoke", "--telegram-id", "5")
    assert revoked.returncode == 0 and new not in revoked.stdout
    again = tokenshop("keys", "revoke", "--telegram-id", "5")
    assert again.returncode == 2
    assert again.stderr == "tokenshop: error: account 1 has no live key\n"


def test_grant_adds_tokens(tokenshop):
    tokenshop("keys", "issue", "--tokens", "10", "--telegram-id", "9")
    result = tokenshop("grant", "90", "--telegram-id", "9", "--note", "support")
    assert result.returncode == 0
    assert "100 tokens available" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("grant", "lots", "--account", "1"),
        ("grant", "0", "--account", "1"),
        ("balance",),
        ("balance", "--account", "404"),
        ("keys", "issue"),
        ("keys", "issue", "--tokens", "-1"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(tokenshop, args):
    result = tokenshop(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("tokenshop: error: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_audit_passes_on_clean_books_and_fails_on_a_mismatch(tokenshop, engine):
    tokenshop("keys", "issue", "--tokens", "100")
    clean = tokenshop("audit")
    assert (clean.returncode, clean.stdout.strip()) == (0, "audit: ok")

    with Session(engine) as session:
        account = session.get(Account, 1)
        account.balance = 1_000_000
        session.add(account)
        session.commit()
    broken = tokenshop("audit")
    assert broken.returncode == 1
    assert "balance 1000000 != ledger sum 100" in broken.stdout


def test_packs_lists_the_catalog(tokenshop):
    result = tokenshop("packs")
    assert result.returncode == 0
    assert "starter\t100000 tokens\t50 XTR" in result.stdout
    assert "plan" not in result.stdout  # no PLANS: no plans


def test_packs_lists_the_monthly_plans_after_the_packs(tokenshop):
    result = tokenshop("packs", PLANS="basic:1000000:300:Basic")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == (
        "basic\t1000000 tokens every 30 days\t300 XTR\tBasic (plan)"
    )
