"""The FastAPI application factory.

``create_app(settings)`` wires routers, the one error shape, the DB session factory and, in the
embedded mode (no Redis), start-up work: migrations, demo data, the in-process training worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from threadpoolctl import threadpool_limits

from app.api import admin, dashboard, health, ingest, observability, privileged, public, public_data
from app.api import votes as votes_api
from app.api.contract import install_error_docs
from app.api.errors import install_error_handlers, render
from app.api.health import __version__
from app.api.observability import configure_logging
from app.api.openapi_yaml import to_yaml
from app.config import DEFAULT_SECRET_KEY, Settings, get_settings
from app.db.migrate import upgrade_head
from app.db.session import get_sessionmaker
from app.errors import PayloadTooLarge
from app.services import budget, demo
from app.services.training.embedded_worker import start_embedded_worker
from app.services.unit_of_work import commit

log = logging.getLogger("privrec")

__all__ = ["create_app", "create_app_from_env", "openapi_yaml"]

DESCRIPTION = """\
privrec learns recommendations from users' ratings under **user-level differential privacy**
(joint DP / billboard model) and keeps a persisted (epsilon, delta) ledger of every release.

* Public routes serve DP outputs only (item embeddings, DP counts, model metadata).
* Privileged routes compute one user's scores from the published model plus that user's own
  ratings; only that user (or a service with the `act_for_users` scope) may call them.
* Admin routes manage the privacy budget, trainings and model versions.

Every error has the shape `{"error": {"code", "message", "details"}}`.
"""

MAX_BODY_BYTES = 16 * 1024 * 1024  # a full 10,000-row batch with 128-character ids is ~3 MiB

TAGS = [
    {"name": "ingest", "description": "Write ratings and items (user token or service token with `ingest`)."},
    {"name": "public", "description": "DP outputs of the active model; no token needed."},
    {"name": "privileged", "description": "One user's own data and recommendations."},
    {"name": "admin", "description": "Privacy budget, ledger, trainings, model versions (admin token)."},
    {"name": "health", "description": "Probes."},
]


class ServerTiming:
    """ASGI middleware adding ``Server-Timing: app;dur=<ms>`` (time spent inside the app).

    Opt-in (``SERVER_TIMING=true``): a precise per-request duration is a timing side channel
    (e.g. a fold-in's cost grows with the user's history), so it is off by default."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def send_with_timing(message: dict) -> None:
            if message["type"] == "http.response.start":
                dur = (time.perf_counter() - start) * 1000.0
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", f"app;dur={dur:.3f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_timing)


class BodyLimit:
    """ASGI middleware refusing request bodies above ``max_bytes`` with the JSON 413 error.

    A declared Content-Length is checked before anything is read; a streamed body is counted
    while the route reads it; past the limit the 413 is sent and the rest of the request dropped.
    """

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes", code="body_too_large",
                               details={"max_bytes": self.max_bytes})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                err = self._error()
                response = render(err.status_code, err.code, err.message, err.details)
                await response(scope, receive, send)
                return
        seen = 0
        responded = False

        async def guarded_send(message: dict) -> None:
            if not responded:  # after our 413 the app's own response is dropped
                await send(message)

        async def counting_receive() -> dict:
            nonlocal seen, responded
            message = await receive()
            if message["type"] == "http.request" and not responded:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    err = self._error()
                    await render(err.status_code, err.code, err.message, err.details)(scope, receive, send)
                    responded = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counting_receive, guarded_send)


def _limit_blas_threads() -> None:
    """One BLAS thread per API process: requests already run concurrently, and a multi-threaded
    BLAS spends longer waking its threads than computing a 20,000 x 64 mat-vec (measured 6x
    slower under load). Training's batched solvers set their own thread pools."""
    threadpool_limits(limits=1, user_api="blas")


def _startup(app: FastAPI, settings: Settings) -> None:
    """Every mode: single-threaded BLAS. Embedded mode: migrate, seed demo data when empty,
    start the in-process worker."""
    _limit_blas_threads()
    configure_logging(settings.log_level, settings.log_format)
    if not settings.embedded:
        return
    upgrade_head(settings.database_url)
    with app.state.sessionmaker() as session:
        budget.bootstrap(session, settings)
        commit(session)
    if settings.seed_demo:
        with app.state.sessionmaker() as session:
            demo.seed_if_empty(session, dataset=settings.default_dataset, settings=settings)  # logs the seeding itself
            commit(session)
    if settings.embedded_worker:
        app.state.worker = start_embedded_worker(settings)


def _shutdown(app: FastAPI) -> None:
    worker = getattr(app.state, "worker", None)
    if worker is not None:
        worker.stop()
        app.state.worker = None


def _mount_dashboard(app: FastAPI) -> None:
    """The admin dashboard page, its JSON routes and its static files (no build step)."""
    app.include_router(dashboard.router)
    app.mount("/dashboard/static", StaticFiles(directory=Path(__file__).resolve().parent / "static"),
              name="dashboard-static")


def create_app_from_env() -> FastAPI:
    """The app for the process-wide validated settings (uvicorn's factory in ``privrec api``)."""
    return create_app(get_settings())


def create_app(settings: Settings) -> FastAPI:
    """Build the app for ``settings``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _startup(app, settings)
        try:
            yield
        finally:
            _shutdown(app)

    app = FastAPI(
        title="privrec",
        version=__version__,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.sessionmaker = get_sessionmaker(settings.database_url)
    app.state.worker = None
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    if settings.server_timing:  # opt-in: response times can reveal data-dependent work
        app.add_middleware(ServerTiming)
    app.add_middleware(observability.RequestContext)
    app.include_router(health.router)
    app.include_router(observability.router)
    app.include_router(ingest.router, prefix="/v1")
    app.include_router(public.router, prefix="/v1")
    app.include_router(privileged.router, prefix="/v1")
    app.include_router(admin.router, prefix="/v1/admin")
    app.include_router(public_data.router, prefix="/v1")
    app.include_router(public_data.admin_router, prefix="/v1/admin")
    app.include_router(votes_api.router, prefix="/v1")
    app.include_router(votes_api.admin_router, prefix="/v1/admin")
    install_error_docs(app)
    _mount_dashboard(app)
    return app


def openapi_document(app: FastAPI | None = None) -> dict[str, Any]:
    """The OpenAPI document the app serves at ``/openapi.json``."""
    if app is None:
        app = create_app(Settings(redis_url=None, secret_key=DEFAULT_SECRET_KEY,
                                  database_url="sqlite:///:memory:"))
    return app.openapi()


def openapi_yaml(app: FastAPI | None = None) -> str:
    """The served OpenAPI document as YAML (what ``openapi.yaml`` in the repo must equal)."""
    return to_yaml(openapi_document(app))
