"""The FastAPI app. `create_app(settings)` builds it; the lifespan owns the long-lived parts:
the database engine, the model engines, this process's lease with its heartbeat, the hold
sweeper, and draining on SIGTERM (`api.lifecycle`). Nothing heavy runs at import."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from anyio import to_thread
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.books import Books
from api.engine.embedding.protocol import EmbeddingClient
from api.engine.protocol import EngineClient
from api.errors import install_error_handlers
from api.lifecycle import (
    Draining,
    Lifecycle,
    heartbeat_forever,
    start_lease,
    stop_lease,
    sweep_forever,
    uvicorn_exit,
)
from api.logging import configure_logging
from api.metrics import Metrics
from api.middleware import RequestContext
from api.miniapp import STATIC_DIR
from api.miniapp.telegram import BotApi
from api.routes import chat, embeddings, health, key, messages, miniapp, models, responses
from api.services import Services
from api.serving.chat import ChatService
from api.serving.embeddings import EmbeddingsService
from api.serving.messages import MessagesService
from api.serving.miniapp import MiniApp
from api.serving.responses import ResponsesService
from api.settings import ApiSettings
from billing.db import make_engine

if TYPE_CHECKING:
    from api.engine.registry import EngineConfig, LoadedModels

logger = logging.getLogger("tokenshop.api")
RETENTION_SWEEP_SECONDS = 3600.0  # stored responses past retention are deleted hourly


def create_app(
    settings: ApiSettings,
    *,
    engines: dict[str, EngineClient] | None = None,
    embedders: dict[str, EmbeddingClient] | None = None,
) -> FastAPI:
    """The app; `engines` (and `embedders`) replace loading `settings.models` (tests with other
    models)."""
    engine_map: dict[str, EngineClient] = {}
    embedder_map: dict[str, EmbeddingClient] = {}
    metrics = Metrics(engine_map, embedder_map)
    lifecycle = Lifecycle(grace_seconds=settings.shutdown_grace_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = make_engine(settings.database_url)
        if engines is not None:
            engine_map.update(engines)
            embedder_map.update(embedders or {})
        else:
            loaded = await _load_all(settings)
            engine_map.update(loaded.engines)
            embedder_map.update(loaded.embedders)
        for engine in engine_map.values():
            await engine.start()
        for embedder in embedder_map.values():
            await embedder.start()
        books = Books(
            db=db,
            hold_ttl=timedelta(seconds=settings.hold_ttl_seconds),
            key_cache_seconds=settings.key_cache_seconds,
            max_concurrent_per_key=settings.max_concurrent_per_key,
            lease=timedelta(seconds=settings.lease_seconds),
            idempotency_retention=timedelta(hours=settings.idempotency_retention_hours),
        )
        chat_service = ChatService(
            engines=engine_map,
            books=books,
            metrics=metrics,
            settings=settings,
            embedding_models=embedder_map,
        )
        embeddings_service = EmbeddingsService(
            embedders=embedder_map,
            chat_models=engine_map,
            books=books,
            metrics=metrics,
            settings=settings,
        )
        responses_service = ResponsesService(chat=chat_service, db=db, settings=settings)
        token = settings.telegram_bot_token  # the Mini App's initData check and invoice links
        bot_api = (
            BotApi(token.get_secret_value(), settings.telegram_api_base_url) if token else None
        )
        app.state.services = Services(
            settings=settings,
            db=db,
            engines=engine_map,
            books=books,
            chat=chat_service,
            metrics=metrics,
            responses=responses_service,
            messages=MessagesService(chat=chat_service, settings=settings),
            embedders=embedder_map,
            embeddings=embeddings_service,
            miniapp=MiniApp(
                settings=settings,
                db=db,
                engines=engine_map,
                secret_key=settings.resolved_secret_key(),
                telegram=bot_api,
            ),
        )
        # a restart resolves what its previous incarnation left before serving
        await start_lease(books, settings.instance_name)
        loops = [
            asyncio.create_task(sweep_forever(books, settings.sweep_seconds)),
            asyncio.create_task(
                heartbeat_forever(books, settings.instance_name, settings.heartbeat_seconds)
            ),
            asyncio.create_task(responses_service.forget_forever(every=RETENTION_SWEEP_SECONDS)),
        ]
        restore_sigterm = lifecycle.on_sigterm(uvicorn_exit())
        try:
            yield
        finally:
            restore_sigterm()
            for loop in loops:
                loop.cancel()
                with suppress(asyncio.CancelledError):
                    await loop
            await chat_service.finish_settling(within=5)
            await embeddings_service.finish_settling(within=5)
            await stop_lease(books)
            if bot_api is not None:
                await bot_api.close()
            for engine in engine_map.values():
                await engine.shutdown()
            for embedder in embedder_map.values():
                await embedder.shutdown()
            db.dispose()

    app = FastAPI(
        title="Tokenshop",
        summary="An OpenAI-compatible chat completions API, paid in tokens.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.state.lifecycle = lifecycle
    app.add_middleware(Draining, lifecycle=lifecycle)  # inside RequestContext: 503s are counted
    app.add_middleware(RequestContext, metrics=metrics, max_body=settings.max_request_bytes)
    routers = (chat.router, responses.router, messages.router, models.router, key.router)
    for router in (*routers, health.router, miniapp.router):
        app.include_router(router)
    app.include_router(embeddings.router)
    # after /app/api's routes, which it would otherwise shadow
    app.mount("/app", StaticFiles(directory=STATIC_DIR, html=True), name="miniapp")
    return app


async def _load_models(settings: ApiSettings) -> dict[str, EngineClient]:
    """The chat models of the settings (`_load_all` for both kinds)."""
    return (await _load_all(settings)).engines


async def _load_all(settings: ApiSettings) -> LoadedModels:
    from api.engine.ops.library import default_library, unavailable_reason, use_huge_pages
    from api.engine.registry import EngineConfig, load_models

    missing = unavailable_reason() if settings.engine_int4_kernel else "ENGINE_INT4_KERNEL=0"
    library = default_library() if missing is None else None
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
        ops_missing=missing,
        kv_cache_dtype=settings.engine_kv_cache_dtype,
        speculative_tokens=settings.engine_speculative_tokens,
        embedding_batch_tokens=settings.embedding_batch_tokens,
    )
    if not settings.models_file:
        return await to_thread.run_sync(load_models, settings.models, config)
    return await to_thread.run_sync(_load_models_file, settings, config)


def _load_models_file(settings: ApiSettings, config: EngineConfig) -> LoadedModels:
    """MODELS_FILE's models (it replaces MODELS): local exports and upstream servers."""
    from api.engine.registry import LoadedModels, load_export
    from api.engine.upstream import UpstreamEmbeddingEngine, UpstreamEngine, UpstreamTimeouts
    from api.models_file import LocalModel, read_models_file

    assert settings.models_file
    timeouts = UpstreamTimeouts(
        connect=settings.upstream_connect_seconds,
        first_token=settings.upstream_first_token_seconds,
        read=settings.upstream_read_seconds,
        health_every=settings.upstream_health_seconds,
    )
    loaded = LoadedModels()
    for entry in read_models_file(settings.models_file):
        if isinstance(entry, LocalModel):
            model = load_export(entry.name, entry.path, config, truncate=entry.truncate)
            loaded.add(entry.name, model)
        elif entry.kind == "embedding":
            loaded.add(entry.name, UpstreamEmbeddingEngine(entry, timeouts=timeouts))
        else:
            loaded.add(entry.name, UpstreamEngine(entry, timeouts=timeouts))
    return loaded


def _engine_cache_dir(setting: str | None) -> Path | None:
    from api.engine.model.session_cache import default_cache_dir

    if setting is None:
        return default_cache_dir()
    return Path(setting) if setting else None


def app_from_environment() -> FastAPI:
    """The uvicorn factory (`tokenshop serve`, Procfile): settings from the environment."""
    configure_logging()
    return create_app(ApiSettings())
