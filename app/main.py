"""The FastAPI application factory.

``create_app(settings)`` wires routers, the one error shape, the DB session factory and, in the
embedded mode (no Redis), start-up work: migrations, demo data, the in-process training worker.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from threadpoolctl import threadpool_limits

from app.api import observability
from app.api.contract import install_error_docs
from app.api.errors import install_error_handlers
from app.api.middleware import install_middleware
from app.api.observability import configure_logging
from app.api.openapi_yaml import to_yaml
from app.api.routes import ROUTERS, dashboard, health
from app.api.routes.health import __version__
from app.config import DEFAULT_SECRET_KEY, Settings, get_settings
from app.db.async_read import close_pools
from app.db.migrate import upgrade_head
from app.db.session import engine_options, get_sessionmaker
from app.services import budget, demo
from app.services.training.embedded_worker import start_embedded_worker
from app.services.unit_of_work import commit

log = logging.getLogger("privrec")

__all__ = ["create_app", "create_app_from_env", "freeze_full_collection_survivors", "freeze_startup_heap", "openapi_yaml"]

DESCRIPTION = """\
privrec learns recommendations from users' ratings under **user-level differential privacy**
(joint DP / billboard model) and keeps a persisted (epsilon, delta) ledger of every release.

* Public routes serve DP outputs only (item embeddings, DP counts, model metadata).
* Privileged routes compute one user's scores from the published model plus that user's own
  ratings; only that user (or a service with the `act_for_users` scope) may call them.
* Admin routes manage the privacy budget, trainings and model versions.

Every error has the shape `{"error": {"code", "message", "details"}}`.
"""

TAGS = [
    {"name": "ingest", "description": "Write ratings and items (user token or service token with `ingest`)."},
    {"name": "public", "description": "DP outputs of the active model; no token needed."},
    {"name": "privileged", "description": "One user's own data and recommendations."},
    {"name": "admin", "description": "Privacy budget, ledger, trainings, model versions (admin token)."},
    {"name": "health", "description": "Probes."},
]


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
    """The app for the process-wide validated settings (uvicorn's factory in ``privrec api``),
    with the server process's start-up heap frozen (:func:`freeze_startup_heap`) and every later
    full collection's survivors too (:func:`freeze_full_collection_survivors`)."""
    app = create_app(get_settings())
    freeze_startup_heap()
    freeze_full_collection_survivors()
    return app


def freeze_startup_heap() -> None:
    """Exempt what start-up built (modules, routes, schemas: ~10^5 objects that live as long as
    the server process) from the cyclic garbage collector, whose full collections otherwise walk
    them all and pause every request of the process (a full pass over a warm server's heap: tens
    of milliseconds; ~150 ms with a trained model's heap). Only for a server process: objects
    frozen here are never collected, so code that builds many apps (tests) must not call it."""
    gc.collect()
    gc.freeze()


def freeze_full_collection_survivors() -> None:
    """After every full collection of the cyclic collector, move what survived it to the
    permanent generation, so the next full collection walks only what became old since; every
    ``REFREEZE_S`` one full collection starts with everything unfrozen instead.

    A serving process keeps growing long-lived state after start-up (the model it loads on its
    first request, per-user fold-in states, verified tokens); each full collection walked all of
    it again (measured in `serve`: 5 ms passes growing to 22 ms in a closed loop, none of which
    found garbage, each pausing every request of the process). What is frozen survived a full
    pass, so it was reachable; once released it is still freed by reference counting, but a
    reference cycle among frozen objects (a closed connection's protocol and transport, an old
    model version) only goes at the next unfrozen pass: that bounds the memory such cycles can
    hold to what dies within ``REFREEZE_S``, at the price of one full walk of the heap (tens of
    milliseconds) that often. Idempotent; server processes only (like :func:`freeze_startup_heap`)."""
    if _freeze_after_full not in gc.callbacks:
        _unfrozen_at[0] = time.monotonic()
        gc.callbacks.append(_freeze_after_full)


REFREEZE_S = 600.0
_unfrozen_at = [0.0]  # when the last full collection started with everything unfrozen


def _freeze_after_full(phase: str, info: dict[str, int]) -> None:
    if info.get("generation") != 2:
        return
    if phase == "start" and time.monotonic() - _unfrozen_at[0] >= REFREEZE_S:
        gc.unfreeze()  # this pass walks (and can free) everything, start-up heap included
        _unfrozen_at[0] = time.monotonic()
    elif phase == "stop":
        gc.freeze()


def create_app(settings: Settings) -> FastAPI:
    """Build the app for ``settings``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _startup(app, settings)
        try:
            yield
        finally:
            _shutdown(app)
            await close_pools()

    app = FastAPI(
        title="privrec",
        version=__version__,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.sessionmaker = get_sessionmaker(settings.database_url, engine_options(settings))
    app.state.worker = None
    install_error_handlers(app)
    install_middleware(app, settings)
    app.include_router(health.router)
    app.include_router(observability.router)
    for router in ROUTERS:
        app.include_router(router, prefix="/v1")
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
