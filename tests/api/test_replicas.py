"""Three API processes on one database, as the Procfile runs them behind a load balancer: a key's
limit of requests in flight holds across all three, a replica killed mid-stream has its holds
resolved by the others within 30 s (whatever HOLD_TTL_SECONDS is) with the books clean, and a
key revoked through the CLI is refused by every replica within KEY_CACHE_SECONDS + 1 s.

They run on either database: on SQLite the three processes share one file (one writer at a
time), and the same statements enforce the same rules; PostgreSQL is what production uses."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from billing.db import reading
from billing.models import Account, Hold, IdempotentRequest
from tests.api.replicas import Replica, audit_cli, replicas, start, stop, tokenshop, wait_ready
from tests.factories import make_account, make_key
from tests.faults import poll

LIMIT = 4
CLIENTS = 12  # four per replica, all on one key
REQUESTS_PER_CLIENT = 6
PROMPT = [{"role": "user", "content": "Tell me a long story."}]

pytestmark = pytest.mark.slow  # three model-serving processes per test: ~40 s each on 2 cores


def funded_key(engine: Engine, secret_key: bytes, tokens: int = 5_000_000) -> tuple[str, int]:
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=tokens)
        assert account.id is not None
        return make_key(writer, account, secret_key=secret_key), account.id


def open_holds(engine: Engine, account_id: int) -> int:
    with Session(reading(engine)) as session:
        return session.exec(
            select(func.count())
            .select_from(Hold)
            .where(col(Hold.account_id) == account_id, col(Hold.state) == "held")
        ).one()


class Sampler(threading.Thread):
    """Reads the account's open holds from the database, over and over, keeping the peak."""

    def __init__(self, engine: Engine, account_id: int) -> None:
        super().__init__(daemon=True)
        self.engine, self.account_id = engine, account_id
        self.peak = 0
        self.samples = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.peak = max(self.peak, open_holds(self.engine, self.account_id))
            self.samples += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


async def _hammer(servers: list[Replica], key: str) -> list[int]:
    """Every client sends streaming requests back to back to its replica; their statuses."""
    statuses: list[int] = []

    async def client_loop(index: int) -> None:
        server = servers[index % len(servers)]
        async with openai.AsyncOpenAI(base_url=server.v1, api_key=key, max_retries=0) as client:
            for _ in range(REQUESTS_PER_CLIENT):
                try:
                    stream = await client.chat.completions.create(
                        model="demo",
                        messages=PROMPT,
                        max_tokens=48,
                        stream=True,  # type: ignore[arg-type]
                    )
                    async for _chunk in stream:
                        pass
                    statuses.append(200)
                except openai.APIStatusError as error:
                    statuses.append(error.status_code)
                    await asyncio.sleep(0.02)

    await asyncio.gather(*(client_loop(i) for i in range(CLIENTS)))
    return statuses


def test_a_key_limited_to_4_never_has_more_than_4_requests_running_across_three_replicas(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    key, account_id = funded_key(engine, secret_key)
    with replicas(database_url, tmp_path, MAX_CONCURRENT_PER_KEY=str(LIMIT)) as servers:
        sampler = Sampler(engine, account_id)
        sampler.start()
        try:
            statuses = asyncio.run(_hammer(servers, key))
        finally:
            sampler.stop()

    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0  # twelve clients on a key of four: the limit was reached
    assert statuses.count(200) >= CLIENTS  # and every slot freed was used again
    assert sampler.samples > 10
    assert sampler.peak == LIMIT  # reached, never passed, across the three
    assert open_holds(engine, account_id) == 0
    result = audit_cli(database_url, tmp_path)
    assert result.returncode == 0 and "audit: ok" in result.stdout, result.stdout + result.stderr


class Stream(threading.Thread):
    """A long streaming request that reads until the server dies under it."""

    def __init__(self, server: Replica, key: str) -> None:
        super().__init__(daemon=True)
        self.server, self.key = server, key
        self.received = 0

    def run(self) -> None:
        body = {
            "model": "demo",
            "messages": PROMPT,
            "max_tokens": 2000,
            "temperature": 0,  # the demo model then runs to max_tokens
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST",
                f"{self.server.v1}/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=60,
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        self.received += 1
        except httpx.TransportError:
            pass  # killed


def test_a_replica_killed_mid_stream_has_its_holds_resolved_by_the_others_within_30_s(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    key, account_id = funded_key(engine, secret_key)
    with replicas(database_url, tmp_path, CHECKPOINT_SECONDS="0.1") as servers:
        victim, survivor = servers[1], servers[0]
        streams = [Stream(victim, key) for _ in range(2)]
        for stream in streams:
            stream.start()
        poll(
            lambda: all(s.received > 5 for s in streams) and _checkpointed(engine) == 2,
            within=60,
            what="both streams generating and checkpointed",
        )
        victim.kill()
        killed_at = time.monotonic()
        left = {hold.id: hold.used for hold in _holds(engine) if hold.state == "held"}
        assert len(left) == 2

        # HOLD_TTL_SECONDS is its default, 300: the lease, not the expiry, frees them
        poll(lambda: open_holds(engine, account_id) == 0, within=30, what="holds resolved")
        resolved_after = time.monotonic() - killed_at

        after = {hold.id: hold for hold in _holds(engine)}
        for hold_id, used in left.items():
            assert after[hold_id].state == "settled"
            assert after[hold_id].used >= used > 0  # billed its last checkpoint
        answer = httpx.post(
            f"{survivor.v1}/chat/completions",
            json={"model": "demo", "messages": PROMPT, "max_tokens": 4},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert answer.status_code == 200

    assert resolved_after < 30
    with Session(reading(engine)) as session:
        account = session.get(Account, account_id)
        assert account is not None and account.open_holds == 0 and account.held == 0
    result = audit_cli(database_url, tmp_path)
    assert result.returncode == 0 and "audit: ok" in result.stdout, result.stdout + result.stderr


def _holds(engine: Engine) -> list[Hold]:
    with Session(reading(engine), expire_on_commit=False) as session:
        return list(session.exec(select(Hold)))


def _checkpointed(engine: Engine) -> int:
    return sum(hold.state == "held" and hold.used > 0 for hold in _holds(engine))


def test_a_key_revoked_through_the_cli_is_refused_by_every_replica_within_the_cache_time(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    cache_seconds = 2.0
    key, account_id = funded_key(engine, secret_key)
    headers = {"Authorization": f"Bearer {key}"}
    with replicas(database_url, tmp_path, KEY_CACHE_SECONDS=str(cache_seconds)) as servers:
        revoked = threading.Event()
        rounds = [0]

        def keep_asking() -> None:  # each replica has the key cached up to the revocation
            while not revoked.is_set():
                for server in servers:
                    httpx.get(f"{server.v1}/key", headers=headers)
                rounds[0] += 1

        for server in servers:
            assert httpx.get(f"{server.v1}/key", headers=headers).status_code == 200
        asker = threading.Thread(target=keep_asking, daemon=True)
        asker.start()
        poll(lambda: rounds[0] > 0, within=10, what="the key asked for on every replica")
        result = tokenshop(database_url, tmp_path, "keys", "revoke", "--account", str(account_id))
        revoked.set()
        revoked_at = time.monotonic()
        assert result.returncode == 0, result.stdout + result.stderr
        asker.join(timeout=30)

        for server in servers:
            poll(
                lambda server=server: (
                    httpx.get(f"{server.v1}/key", headers=headers).status_code == 401
                ),
                within=cache_seconds + 1 - (time.monotonic() - revoked_at),
                what=f"{server.name} refuses the revoked key",
            )
        refused_after = time.monotonic() - revoked_at
        codes = [httpx.get(f"{s.v1}/key", headers=headers).status_code for s in servers]

    assert refused_after <= cache_seconds + 1
    assert codes == [401, 401, 401]


def test_a_retry_takes_over_the_idempotency_key_of_a_replica_that_died(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    key, account_id = funded_key(engine, secret_key)
    body = {"model": "demo", "messages": PROMPT, "max_tokens": 2000, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "order-42"}
    settings = {"LEASE_SECONDS": "2", "HEARTBEAT_SECONDS": "0.5", "SWEEP_SECONDS": "0.5"}
    with replicas(database_url, tmp_path, count=2, **settings) as (first, second):
        asker = threading.Thread(
            target=lambda: _post_quietly(f"{first.v1}/chat/completions", body, headers),
            daemon=True,
        )
        asker.start()
        poll(lambda: open_holds(engine, account_id) == 1, within=60, what="the first attempt")
        first.kill()
        with Session(reading(engine)) as session:  # it died before it could answer
            (claim,) = session.exec(select(IdempotentRequest)).all()
            assert claim.status_code is None and claim.owner is not None

        answers: list[int] = []

        def retried() -> bool:
            answer = httpx.post(
                f"{second.v1}/chat/completions", json=body, headers=headers, timeout=120
            )
            answers.append(answer.status_code)
            return answer.status_code != 409  # 409 while the dead replica's lease still runs

        poll(retried, within=30, what="the key taken over", every=0.2)
        again = httpx.post(f"{second.v1}/chat/completions", json=body, headers=headers, timeout=60)

    assert answers[-1] == 200 and set(answers) <= {200, 409}
    assert again.status_code == 200  # replayed, not run a third time
    result = audit_cli(database_url, tmp_path)
    assert result.returncode == 0 and "audit: ok" in result.stdout, result.stdout + result.stderr


def _post_quietly(url: str, body: dict[str, object], headers: dict[str, str]) -> None:
    with contextlib.suppress(httpx.TransportError):  # its replica was killed
        httpx.post(url, json=body, headers=headers, timeout=120)


def test_a_replica_restarted_under_its_name_settles_what_it_left_before_it_serves(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    """Neither its lease (10 minutes here) nor its holds' expiry (5) has run out: the restart
    under the same INSTANCE_NAME is what frees them, before /ready says 200."""
    key, account_id = funded_key(engine, secret_key)
    settings = {"CHECKPOINT_SECONDS": "0.1", "LEASE_SECONDS": "600"}
    first = start(database_url, tmp_path, "web.1", **settings)
    try:
        wait_ready(first)
        stream = Stream(first, key)
        stream.start()
        poll(
            lambda: stream.received > 5 and _checkpointed(engine) == 1,
            within=60,
            what="the stream generating and checkpointed",
        )
        first.kill()
        (left,) = [hold for hold in _holds(engine) if hold.state == "held"]
    finally:
        stop(first)

    again = start(database_url, tmp_path, "web.1", **settings)
    try:
        wait_ready(again)
        (hold,) = _holds(engine)
        assert hold.id == left.id and hold.state == "settled" and hold.used >= left.used > 0
        assert open_holds(engine, account_id) == 0
    finally:
        stop(again)
