"""Load, bounded: many streaming clients at once get their answers, and the books end up saying
exactly what every client was told it used. The driver is bench/load.py's, run here for a
fixed number of requests instead of a fixed time; no speed is asserted (that is the bench's
table)."""

from __future__ import annotations

from collections import defaultdict

import anyio
import pytest
from sqlalchemy import func
from sqlmodel import Session, col, select

from bench.load import drive
from billing import ledger
from billing.db import reading
from billing.keys import authenticate
from billing.models import Hold, LedgerEntry

CLIENTS = 16
REQUESTS = 96
FUNDS = 200_000
SHARED = 4  # the last SHARED clients share one key, limited to 2 at a time: deliberate 429s


@pytest.mark.slow  # 96 streamed requests from 16 clients
def test_sixteen_streaming_clients_are_served_and_billed_exactly_what_they_were_told(
    start_server, make_funded_key, engine
):
    server = start_server(max_concurrent_per_key=2)
    own = [make_funded_key(FUNDS) for _ in range(CLIENTS - SHARED)]
    keys = own + [make_funded_key(FUNDS)] * SHARED

    result = anyio.run(
        lambda: drive(server.base_url, keys, clients=CLIENTS, requests=REQUESTS, max_tokens=16)
    )

    assert len(result.outcomes) == REQUESTS
    refused = [o for o in result.outcomes if o.status != 200]
    assert {o.status for o in refused} <= {429}, [o.error for o in refused]
    assert all(o.client >= CLIENTS - SHARED for o in refused)  # only the shared key's clients
    assert {o.client for o in result.ok} >= set(range(CLIENTS - SHARED))
    assert all(o.completion_tokens > 0 and o.prompt_tokens > 0 for o in result.ok)
    told: dict[str, int] = defaultdict(int)
    for outcome in result.ok:
        told[keys[outcome.client]] += outcome.prompt_tokens + outcome.completion_tokens

    with Session(reading(engine)) as session:
        for key in set(keys):
            account_id = authenticate(session=session, key=key).account_id
            balance = ledger.get_balance(session=session, account_id=account_id)
            assert balance.used == told[key]  # what the clients were told, to the token
            assert balance.balance == FUNDS - told[key]
            assert balance.held == 0
        billed = session.exec(
            select(func.count()).where(col(LedgerEntry.kind) == "usage", LedgerEntry.amount < 0)
        ).one()
        assert billed == len(result.ok)  # every answered request billed once, refusals never
        assert session.exec(select(Hold).where(col(Hold.state) == "held")).all() == []
        assert ledger.audit(session=session) == []
    stats = server.services.engines["demo"].stats()
    assert stats.active_sequences == 0 and stats.queued_sequences == 0
    assert result.billed_tokens() == sum(told.values())
