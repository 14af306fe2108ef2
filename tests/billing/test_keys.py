"""API keys as a buyer and an attacker meet them."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlmodel import select

from billing import keys
from billing.errors import InvalidKey, RevokedKey
from billing.models import ApiKey
from tests.factories import make_account, make_key


def test_a_key_has_the_documented_shape_and_a_valid_checksum(session, secret_key):
    key = make_key(session, make_account(session), secret_key=secret_key)
    assert key.startswith("sk-tks-") and len(key) == len("sk-tks-") + 40 + 6
    assert keys.is_well_formed(key)
    typo = key[:10] + ("A" if key[10] != "A" else "B") + key[11:]
    assert not keys.is_well_formed(typo)


def test_only_a_hash_of_the_key_is_stored(session, secret_key):
    account = make_account(session)
    key = make_key(session, account, secret_key=secret_key)
    row = session.exec(select(ApiKey)).one()
    assert row.key_hash == keys.hash_key(key)
    assert key not in (row.salt, row.key_hash, row.hint)


def test_the_key_can_be_shown_again_from_its_salt(session, secret_key):
    account = make_account(session)
    key = make_key(session, account, secret_key=secret_key)
    assert keys.show_key(session=session, account_id=account.id, secret_key=secret_key) == key
    assert keys.mask_key(key) == "sk-tks-…" + key[-4:]


def test_a_malformed_key_is_rejected_without_touching_the_database(engine, session):
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    for bad in ["", "sk-foo", "sk-tks-" + "a" * 46, "Bearer x", "sk-tks-\x00" + "a" * 45]:
        with pytest.raises(InvalidKey):
            keys.authenticate(session=session, key=bad)
    assert statements == []


def test_a_well_formed_unknown_key_is_invalid(session):
    forged = keys.derive_key(b"some other secret", "salt")
    with pytest.raises(InvalidKey) as refused:
        keys.authenticate(session=session, key=forged)
    assert forged not in str(refused.value)


def test_rotation_revokes_the_old_key_and_the_new_one_works(session, secret_key):
    account = make_account(session)
    old = make_key(session, account, secret_key=secret_key)
    new = keys.rotate_key(session=session, account_id=account.id, secret_key=secret_key)
    session.commit()
    assert new != old
    with pytest.raises(RevokedKey):
        keys.authenticate(session=session, key=old)
    assert keys.authenticate(session=session, key=new).account_id == account.id


def test_a_revoked_key_no_longer_authenticates(session, secret_key):
    account = make_account(session)
    key = make_key(session, account, secret_key=secret_key)
    assert keys.revoke_key(session=session, account_id=account.id)
    session.commit()
    with pytest.raises(RevokedKey):
        keys.authenticate(session=session, key=key)
    assert keys.show_key(session=session, account_id=account.id, secret_key=secret_key) is None
    assert keys.revoke_key(session=session, account_id=account.id) is False


def test_ensure_key_issues_once(session, secret_key):
    account = make_account(session)
    first, created = keys.ensure_key(session=session, account_id=account.id, secret_key=secret_key)
    again, created_again = keys.ensure_key(
        session=session, account_id=account.id, secret_key=secret_key
    )
    assert (created, created_again) == (True, False)
    assert first == again
