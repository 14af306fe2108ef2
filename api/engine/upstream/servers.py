"""`UpstreamServers`: the servers behind one upstream model, whatever it serves.

What chat (`engine.py`) and embeddings (`embedding.py`) share: the base URLs as `Backend`s, a
health check of each every `health_every` seconds (`GET /models`, which also tells vLLM's
`max_model_len`), the choice of the healthy server with the fewest requests in flight, the
connection pool of `http.py`, the API key in the request header only, and what an upstream's
refusal means: a 5xx, 429, 408, 401 or 403 tries the next server; a 4xx is the request's own
fault and reaches the client as `UpstreamRejected`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from api.engine.errors import ModelLoadError, UpstreamRejected, UpstreamUnavailable
from api.engine.protocol import BackendStats
from api.engine.upstream import http, wire
from api.engine.upstream.backend import Backend
from api.engine.upstream.config import DEFAULT_CONTEXT_LENGTH, UpstreamConfig, UpstreamTimeouts

logger = logging.getLogger("tokenshop.upstream")
T = TypeVar("T")

# Statuses that say "this upstream cannot take it now", not "this request is wrong".
_RETRY_STATUSES = {401, 403, 408, 429}
_REJECT_AS_400 = {422}


class TryNext(Exception):
    """This upstream failed before answering (or before the first token); the request goes to
    the next one."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class UpstreamServers:
    """The upstream servers of one model; a model's engine is one of these."""

    def __init__(self, config: UpstreamConfig, *, timeouts: UpstreamTimeouts | None = None):
        if not config.upstreams:
            raise ModelLoadError(f"model {config.name!r}: upstreams is empty")
        self.model_id = config.name
        self.config = config
        self.timeouts = timeouts or UpstreamTimeouts()
        self.pool = [Backend(url) for url in config.upstreams]
        self.context_length = config.context_length or DEFAULT_CONTEXT_LENGTH
        self.created = int(time.time())
        self._client: httpx.AsyncClient | None = None  # health checks
        self._pool: http.Pool | None = None  # the requests themselves
        self._health: asyncio.Task[None] | None = None
        self._headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    async def check_health(self) -> None:
        if not any(backend.up for backend in self.pool):
            raise UpstreamUnavailable(f"no upstream of model {self.model_id!r} is up")

    def backends(self) -> list[BackendStats]:
        return [backend.stats() for backend in self.pool]

    async def _open(self) -> None:
        """The clients, and a first health check of every server (before serving)."""
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=self.timeouts.connect),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=len(self.pool)),
            trust_env=False,  # like the requests' pool: straight to the upstream
        )
        self._pool = http.Pool(connect_timeout=self.timeouts.connect)
        await self._check_all()

    def _watch(self) -> None:
        self._health = asyncio.create_task(self._check_forever(), name=f"health-{self.model_id}")

    async def shutdown(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        if self._client is not None:
            await self._client.aclose()
        if self._pool is not None:
            self._pool.close()

    # -- routing and failover ------------------------------------------------------------------

    def _pick(self, tried: set[int]) -> int | None:
        """The untried upstream with the fewest requests in flight, healthy ones first."""
        left = [i for i in range(len(self.pool)) if i not in tried]
        if not left:
            return None
        return min(left, key=lambda i: (not self.pool[i].up, self.pool[i].in_flight))

    def _failed_over(self, backend: Backend, failure: TryNext, request_id: str) -> str:
        """Count a failure before the answer, log it; the reason for the final 503's count."""
        backend.errors[failure.kind] += 1
        backend.failovers += 1
        logger.warning(
            "upstream %s failed before the first token of %s (%s); trying the next",
            backend.url,
            request_id,
            failure,
        )
        return f"{backend.url}: {failure}"

    def _unavailable(self, tried: int) -> UpstreamUnavailable:
        return UpstreamUnavailable(
            f"No upstream server of model '{self.model_id}' could take the request "
            f"({tried} tried). Please retry shortly."
        )

    async def _post_json(
        self, path: str, body: dict[str, Any], parse: Callable[[Any], T], request_id: str
    ) -> T:
        """POST `body` to `{base}{path}` of a healthy server and return `parse` of its 200's
        JSON, failing over before an answer as a stream does before its first token
        (`engine.py`): a connection refused, a 5xx or 429, no answer within the read timeout,
        or an answer `parse` refuses (ValueError). A 4xx is `UpstreamRejected`, every server
        failing `UpstreamUnavailable`."""
        assert self._pool is not None, "start() the engine first"
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        tried: set[int] = set()
        reasons: list[str] = []
        while (index := self._pick(tried)) is not None:
            tried.add(index)
            backend = self.pool[index]
            backend.requests += 1
            backend.in_flight += 1
            started = time.monotonic()
            try:
                answer = await self._attempt_json(backend, path, payload, parse)
                backend.up = True
                backend.observe_ttft(time.monotonic() - started)
                return answer
            except TryNext as failure:
                reasons.append(self._failed_over(backend, failure, request_id))
            finally:
                backend.in_flight -= 1
        raise self._unavailable(len(reasons))

    async def _attempt_json(
        self, backend: Backend, path: str, payload: bytes, parse: Callable[[Any], T]
    ) -> T:
        assert self._pool is not None
        response: http.Response | None = None
        try:
            response = await self._pool.post(
                f"{backend.url}{path}", payload, self._headers, read_timeout=self.timeouts.read
            )
            await self._refuse_unless_ok(backend, response)
            return parse(json.loads(await response.read()))
        except http.ConnectFailed as exc:
            backend.up = False
            raise TryNext("connect", str(exc)) from None
        except http.ReadTimeout:
            raise TryNext("timeout", "no answer in time") from None
        except (http.BrokenOff, ValueError) as exc:
            raise TryNext("cut", type(exc).__name__) from None
        finally:
            if response is not None:
                await response.aclose()

    async def _refuse_unless_ok(self, backend: Backend, response: http.Response) -> None:
        status = response.status
        if status == 200:
            return
        body = await response.read()
        try:
            document: Any = json.loads(body)
        except ValueError:
            document = None
        if status >= 500 or status in _RETRY_STATUSES:
            if status in (401, 403):
                logger.error("upstream %s refused our credentials (%d)", backend.url, status)
            raise TryNext("status", f"status {status}")
        param, code = wire.error_fields(document)
        raise UpstreamRejected(
            400 if status in _REJECT_AS_400 or status < 400 else status,
            wire.error_message(document),
            param=param,
            code=code,
        )

    # -- health --------------------------------------------------------------------------------

    async def _between_checks(self) -> None:
        """Work the health loop does before each wait (chat's calibration); none here."""

    async def _check_forever(self) -> None:
        while True:
            await self._between_checks()
            await asyncio.sleep(self.timeouts.health_every)
            await self._check_all()

    async def _check_all(self) -> None:
        await asyncio.gather(*(self._check(backend) for backend in self.pool))

    def _answers(self, status: int) -> bool:
        """Whether a health check's status means the server is up."""
        return status == 200

    async def _check(self, backend: Backend) -> None:
        """`GET /models`: up if it answers (`_answers`); its `max_model_len`, where it gives
        one, is the context length unless the models file set one."""
        assert self._client is not None
        try:
            response = await self._client.get(
                f"{backend.url}/models",
                headers=self._headers,
                timeout=httpx.Timeout(self.timeouts.connect + 2, connect=self.timeouts.connect),
            )
        except httpx.HTTPError as exc:
            if backend.up:
                logger.warning("upstream %s is down: %s", backend.url, type(exc).__name__)
            backend.up = False
            return
        was_up, backend.up = backend.up, self._answers(response.status_code)
        if was_up != backend.up:
            logger.warning(
                "upstream %s is %s", backend.url, "up" if backend.up else f"down ({response})"
            )
        if backend.up and response.status_code == 200 and self.config.context_length is None:
            self._learn_context_length(response)

    def _learn_context_length(self, response: httpx.Response) -> None:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            for model in response.json().get("data", []):
                length = model.get("max_model_len")
                if model.get("id") == self.config.upstream_model and isinstance(length, int):
                    self.context_length = length
