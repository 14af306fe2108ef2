"""Liveness, readiness and Prometheus metrics for the platform's router and monitoring."""

from __future__ import annotations

import logging
from dataclasses import asdict

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import ServicesDep

router = APIRouter(tags=["operations"])
logger = logging.getLogger("tokenshop.api")


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is up (it may not be able to serve yet: see /ready)."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(services: ServicesDep, request: Request) -> JSONResponse:
    """Models loaded and database reachable; 503 otherwise, so the router sends no traffic.
    `serving` says, per model, which graph edits and kernels serve it and why any faster path
    was not taken, so a deployment that lost its fast path can be alerted on."""
    if request.app.state.lifecycle.draining:  # SIGTERM: out of the load balancer at once
        return JSONResponse({"status": "draining", "checks": {}}, status_code=503)
    checks: dict[str, str] = {}
    try:
        await services.books.ping()
        checks["database"] = "ok"
    except Exception as exc:
        logger.warning("readiness: database unreachable: %s", type(exc).__name__)
        checks["database"] = "unreachable"
    for name, engine in services.engines.items():
        try:
            await engine.check_health()
            checks[f"model:{name}"] = "ok"
        except Exception:
            checks[f"model:{name}"] = "unavailable"
    for name, embedder in services.embedders.items():
        try:
            await embedder.check_health()
            checks[f"model:{name}"] = "ok"
        except Exception:
            checks[f"model:{name}"] = "unavailable"
    served = bool(services.engines or services.embedders)
    ok = served and all(value == "ok" for value in checks.values())
    paths = {name: engine.serving_path() for name, engine in services.engines.items()}
    upstreams = {name: engine.backends() for name, engine in services.engines.items()}
    upstreams |= {name: embedder.backends() for name, embedder in services.embedders.items()}
    body = {
        "status": "ok" if ok else "unavailable",
        "checks": checks,
        "serving": {name: asdict(path) for name, path in paths.items() if path is not None},
        "backends": {  # each upstream server of a model, by URL
            name: {backend.url: "up" if backend.up else "down" for backend in backends}
            for name, backends in upstreams.items()
            if backends
        },
    }
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    await services.metrics.read_books(services.db)  # open holds and ledger writes, shared
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
