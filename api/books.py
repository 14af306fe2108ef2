"""The API's window on billing: each call is one short transaction, run in a worker thread so
the event loop never waits on the database, and never held open across generation. Writes that
arrive together share a commit (`billing.group_commit`), each naming the account it writes for.

Holds and idempotency claims carry this process's lease (`billing.leases`): `start_lease` before
serving, `renew_lease` on a heartbeat, `end_lease` at a clean exit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from anyio import to_thread
from sqlalchemy import Engine, text
from sqlmodel import Session

from billing import idempotency, key_limits, keys, leases, ledger, stats
from billing.db import reading, session_scope
from billing.errors import InvalidKey
from billing.group_commit import GroupCommit
from billing.idempotency import StoredAnswer
from billing.key_limits import KeyReport
from billing.keys import KeyIdentity
from billing.leases import SweepReport
from billing.ledger import Balance
from billing.models import Hold, utcnow
from billing.stats import KeyUsage

T = TypeVar("T")
MAX_CACHED_IDENTITIES = 100_000  # `Books._identities`: forgotten all at once past this


@dataclass
class Books:
    db: Engine
    hold_ttl: timedelta
    key_cache_seconds: float
    max_concurrent_per_key: int | None = None  # requests in flight per key, on every replica
    lease: timedelta = timedelta(seconds=10)
    idempotency_retention: timedelta = timedelta(hours=24)
    owner: str | None = None  # this process's lease id, once started
    # The clock of keys' limits (periods, minutes, expiry); None: the database's for holds and
    # this process's for the checks before them. Tests set one to cross a period's boundary.
    clock: Callable[[], datetime] | None = None
    _key_cache: dict[str, tuple[float, KeyIdentity]] = field(default_factory=dict)
    _key_lookups: dict[str, asyncio.Future[KeyIdentity]] = field(default_factory=dict)
    _identities: dict[int, KeyIdentity] = field(default_factory=dict)  # by key id, as cached
    _writes: GroupCommit = field(init=False)

    def __post_init__(self) -> None:
        self._writes = GroupCommit(self.db)

    async def _run(
        self,
        work: Callable[[Session], T],
        *,
        write: bool = True,
        accounts: Iterable[int] = (),
        durable: bool = True,
    ) -> T:
        if write:
            return await self._writes.run(work, accounts=accounts, durable=durable)

        def read() -> T:
            with session_scope(reading(self.db)) as session:
                return work(session)

        return await to_thread.run_sync(read)

    async def authenticate(self, key: str) -> KeyIdentity:
        """A live key's owner. Answers are cached briefly, so a revoked key stops working within
        `key_cache_seconds` on every process, without a database read per request, and so do
        changes to its limits; a cached key's expiry is checked on every request."""
        if not keys.is_well_formed(key):
            raise InvalidKey()  # no database read for a malformed key
        digest = keys.hash_key(key)
        cached = self._key_cache.get(digest)
        if cached and cached[0] > time.monotonic():
            cached[1].check(now=self.now())
            return cached[1]
        lookup = self._key_lookups.get(digest)
        if lookup is None:  # requests that arrive together with one key share one read
            lookup = asyncio.ensure_future(self._look_up_key(key, digest))
            self._key_lookups[digest] = lookup
            lookup.add_done_callback(lambda _: self._key_lookups.pop(digest, None))
            lookup.add_done_callback(_read_error)
        return await asyncio.shield(lookup)  # a cancelled request leaves it to the others

    async def _look_up_key(self, key: str, digest: str) -> KeyIdentity:
        now = self.now()
        identity = await self._run(
            lambda s: keys.authenticate(session=s, key=key, now=now), write=False
        )
        self._key_cache[digest] = (time.monotonic() + self.key_cache_seconds, identity)
        if len(self._identities) >= MAX_CACHED_IDENTITIES:
            self._identities.clear()
        self._identities[identity.key_id] = identity
        return identity

    def now(self) -> datetime:
        return self.clock() if self.clock is not None else utcnow()

    def check_key(self, key_id: int | None, *, model: str) -> None:
        """Refuse at once what the key's cached limits refuse (its expiry, its model list),
        before a request is tokenized or sent anywhere; the hold checks them again."""
        identity = self._identities.get(key_id) if key_id is not None else None
        if identity is not None:
            identity.check(model=model, now=self.now())

    async def key_report(self, key_id: int) -> KeyReport | None:
        """The key's limits and its spend this period (`GET /v1/key`)."""
        now = self.now()
        return await self._run(
            lambda s: key_limits.report(session=s, key_id=key_id, now=now), write=False
        )

    async def hold(
        self,
        *,
        account_id: int,
        request_id: str,
        min_cost: int,
        max_cost: int,
        model: str,
        key_id: int | None = None,
    ) -> Hold:
        """Placed with a commit that need not wait for the disk (`billing.db.lazily_flushed`):
        a hold bills nothing until its first checkpoint, a flushed commit that makes it durable
        too, so losing it with the machine before then loses nothing billed."""
        return await self._run(
            lambda s: ledger.hold(
                session=s,
                account_id=account_id,
                request_id=request_id,
                min_tokens=min_cost,
                max_tokens=max_cost,
                ttl=self.hold_ttl,
                model=model,
                limit=self.max_concurrent_per_key,
                owner=self.owner,
                key_id=key_id,
                now=self.clock() if self.clock is not None else None,
                account_locked=True,  # the batch locked `accounts` first
            ),
            accounts=(account_id,),
            durable=False,
        )

    async def checkpoint(self, hold_id: str, used: int, *, account_id: int) -> None:
        await self._run(
            lambda s: ledger.checkpoint(session=s, hold_id=hold_id, used=used, ttl=self.hold_ttl),
            accounts=(account_id,),
        )

    async def settle(
        self,
        hold_id: str,
        *,
        account_id: int,
        cost: int,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> bool:
        """False if the hold was already resolved (by the sweeper): nothing was charged."""
        entry = await self._run(
            lambda s: ledger.settle(
                session=s,
                hold_id=hold_id,
                cost=cost,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            ),
            accounts=(account_id,),
        )
        return entry is not None

    async def release(self, hold_id: str, *, account_id: int) -> None:
        await self._run(
            lambda s: ledger.release(session=s, hold_id=hold_id), accounts=(account_id,)
        )

    async def sweep(self, *, wait: bool = False) -> SweepReport | None:
        """Resolve the holds of processes that are gone (`billing.leases.sweep`); None when
        another process is sweeping. Its own transaction: it locks accounts in its own order."""

        def work(session: Session) -> SweepReport | None:
            return leases.sweep(
                session=session, idempotency_retention=self.idempotency_retention, wait=wait
            )

        return await to_thread.run_sync(self._in_transaction, work)

    async def start_lease(self, name: str) -> str:
        """Start this process's lease, ending earlier incarnations of `name`."""
        self.owner = await to_thread.run_sync(
            self._in_transaction,
            lambda s: leases.start(session=s, name=name, lease=self.lease),
        )
        return self.owner

    async def renew_lease(self) -> bool:
        """The heartbeat; False if the lease had lapsed and was ended (a new one is needed)."""
        owner = self.owner
        if owner is None:
            return False
        return await to_thread.run_sync(
            self._in_transaction,
            lambda s: leases.renew(session=s, process_id=owner, lease=self.lease),
        )

    async def end_lease(self) -> None:
        owner = self.owner
        if owner is not None:
            await to_thread.run_sync(
                self._in_transaction, lambda s: leases.end(session=s, process_id=owner)
            )

    def _in_transaction(self, work: Callable[[Session], T]) -> T:
        with session_scope(self.db) as session:
            return work(session)

    async def key_usage(self, key_id: int) -> tuple[str, KeyUsage]:
        """A key's name, and the requests made and tokens billed with it."""
        return await self._run(lambda s: stats.key_usage(session=s, key_id=key_id), write=False)

    async def balance(self, account_id: int) -> Balance:
        return await self._run(
            lambda s: ledger.get_balance(session=s, account_id=account_id), write=False
        )

    async def claim_idempotency(
        self, account_id: int, key: str, digest: str
    ) -> StoredAnswer | None:
        return await self._run(
            lambda s: idempotency.claim(
                session=s, account_id=account_id, key=key, digest=digest, owner=self.owner
            ),
            accounts=(account_id,),
        )

    async def store_idempotency(self, account_id: int, key: str, status: int, body: str) -> None:
        await self._run(
            lambda s: idempotency.store(
                session=s, account_id=account_id, key=key, status_code=status, body=body
            ),
            accounts=(account_id,),
        )

    async def give_up_idempotency(self, account_id: int, key: str) -> None:
        await self._run(
            lambda s: idempotency.give_up(session=s, account_id=account_id, key=key),
            accounts=(account_id,),
        )

    async def ping(self) -> None:
        """Raise if a hold could not be placed now. It takes the write lock (on SQLite, where a
        reader gets through while another connection holds the database locked), because
        serving needs to write: a database that only reads is not ready."""
        await self._run(lambda s: s.execute(text("SELECT 1")), write=True)


def _read_error(lookup: asyncio.Future[KeyIdentity]) -> None:
    """Take a failed lookup's error, so none is reported unread when its requests are gone."""
    if not lookup.cancelled():
        lookup.exception()
