"""Liveness, readiness and Prometheus metrics for the platform's router and monitoring."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
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
async def ready(services: ServicesDep) -> JSONResponse:
    """Models loaded and database reachable; 503 otherwise, so the router sends no traffic."""
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
    ok = bool(services.engines) and all(value == "ok" for value in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
    )


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
