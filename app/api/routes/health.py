"""Liveness and readiness probes (no authentication, no private data)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version

import redis
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

try:
    __version__ = _pkg_version("privrec")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

router = APIRouter(tags=["health"])


class HealthOut(BaseModel):
    status: str
    version: str


class ReadyOut(BaseModel):
    status: str
    checks: dict[str, str]


@router.get("/health", response_model=HealthOut, summary="Liveness: the process answers")
def health() -> HealthOut:
    return HealthOut(status="ok", version=__version__)


BROKER_TIMEOUT_S = 1.0


def _broker_check(redis_url: str) -> str:
    """'ok' when the Redis broker answers PING within BROKER_TIMEOUT_S, else 'error: <type>'."""
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S)
    try:
        client.ping()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"error: {type(exc).__name__}"
    finally:
        client.close()


@router.get("/ready", response_model=ReadyOut, summary="Readiness: the database (and, in production, the broker) answers",
            responses={503: {"model": ReadyOut, "description": "A dependency is not ready."}})
def ready(request: Request) -> JSONResponse:
    checks: dict[str, str] = {}
    ok = True
    try:
        with request.app.state.sessionmaker() as session:
            session.execute(text("SELECT 1"))
            session.rollback()
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        ok = False
        checks["database"] = f"error: {type(exc).__name__}"
    settings = getattr(request.app.state, "settings", None)
    if settings is not None and not settings.embedded:  # production: trainings need the broker
        checks["broker"] = _broker_check(str(settings.redis_url))
        ok = ok and checks["broker"] == "ok"
    worker = getattr(request.app.state, "worker", None)
    if worker is not None:
        alive = getattr(worker, "is_alive", lambda: True)()
        checks["embedded_worker"] = "ok" if alive else "stopped"
        ok = ok and alive
    body = ReadyOut(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(status_code=200 if ok else 503, content=body.model_dump())
