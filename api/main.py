"""The FastAPI app. `create_app(settings)` builds it; the lifespan owns the long-lived parts:
the database engine, the model engines and the hold sweeper. Nothing heavy runs at import."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from pathlib import Path

from anyio import to_thread
from fastapi import FastAPI

from api.books import Books
from api.engine.protocol import EngineClient
from api.errors import DATABASE_UNAVAILABLE, describe_database_error, install_error_handlers
from api.limits import ConcurrencyLimiter
from api.logging import configure_logging
from api.metrics import Metrics
from api.middleware import RequestContext
from api.routes import chat, health, key, models
from api.services import Services
from api.serving.chat import ChatService
from api.settings import ApiSettings
from billing.db import make_engine

logger = logging.getLogger("tokenshop.api")


def create_app(settings: ApiSettings, *, engines: dict[str, EngineClient] | None = None) -> FastAPI:
    """The app; `engines` replaces loading `settings.models` (tests with other models)."""
    engine_map: dict[str, EngineClient] = {}
    metrics = Metrics(engine_map)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = make_engine(settings.database_url)
        engine_map.update(engines if engines is not None else await _load_models(settings))
        for engine in engine_map.values():
            await engine.start()
        books = Books(
            db=db,
            hold_ttl=timedelta(seconds=settings.hold_ttl_seconds),
            key_cache_seconds=settings.key_cache_seconds,
        )
        chat_service = ChatService(
            engines=engine_map,
            books=books,
            limiter=ConcurrencyLimiter(settings.max_concurrent_per_key),
            metrics=metrics,
            settings=settings,
        )
        app.state.services = Services(
            settings=settings,
            db=db,
            engines=engine_map,
            books=books,
            chat=chat_service,
            metrics=metrics,
        )
        await _sweep_once(books)  # a restart resolves what a crash left before serving
        sweeper = asyncio.create_task(_sweep_forever(books, settings.sweep_seconds))
        try:
            yield
        finally:
            sweeper.cancel()
            with suppress(asyncio.CancelledError):
                await sweeper
            await chat_service.finish_settling(within=5)
            for engine in engine_map.values():
                await engine.shutdown()
            db.dispose()

    app = FastAPI(
        title="Tokenshop",
        summary="An OpenAI-compatible chat completions API, paid in tokens.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(RequestContext, metrics=metrics, max_body=settings.max_request_bytes)
    for router in (chat.router, models.router, key.router, health.router):
        app.include_router(router)
    return app


async def _load_models(settings: ApiSettings) -> dict[str, EngineClient]:
    from api.engine.ops.library import preferred_library, use_huge_pages
    from api.engine.registry import EngineConfig, load_engines

    library = preferred_library() if settings.engine_int4_kernel else None
    if library is not None:
        use_huge_pages(library, settings.engine_huge_pages)
    config = EngineConfig(
        max_active_sequences=settings.max_active_sequences,
        max_queued=settings.max_queued,
        threads=settings.engine_threads or None,
        max_prefill_tokens=settings.max_prefill_tokens,
        cache_dir=_engine_cache_dir(settings.engine_cache_dir),
        fused_attention=settings.engine_fused_attention,
        prefix_cache_mb=settings.engine_prefix_cache_mb,
        arrival_wait_ms=settings.engine_arrival_wait_ms,
        ops_library=library,
        kv_cache_dtype=settings.engine_kv_cache_dtype,
    )
    return await to_thread.run_sync(load_engines, settings.models, config)


def _engine_cache_dir(setting: str | None) -> Path | None:
    from api.engine.model.session_cache import default_cache_dir

    if setting is None:
        return default_cache_dir()
    return Path(setting) if setting else None


async def _sweep_once(books: Books) -> None:
    """Resolve expired holds: those of a crashed process, whose last checkpoint pushed their
    expiry no further. Only expired ones: with several workers on one database, a hold that
    has not expired may belong to a live request of another process."""
    try:
        resolved = await books.sweep()
    except DATABASE_UNAVAILABLE as exc:
        logger.warning("hold sweep failed: %s", describe_database_error(exc))
    except Exception:
        logger.exception("hold sweep failed")
    else:
        if resolved:
            logger.info("released %d stale hold(s)", resolved)


async def _sweep_forever(books: Books, every: float) -> None:
    """Keep sweeping: holds of a crashed process expire `hold_ttl_seconds` after their last
    checkpoint, while this process runs."""
    while True:
        await asyncio.sleep(every)
        await _sweep_once(books)


def app_from_environment() -> FastAPI:
    """The uvicorn factory (`tokenshop serve`, Procfile): settings from the environment."""
    configure_logging()
    return create_app(ApiSettings())
