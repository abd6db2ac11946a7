"""FastAPI dependencies as ``Annotated`` aliases: settings, DB session, the calling principal.

The cheap, non-blocking dependencies are ``async def`` so FastAPI does not hop to a worker
thread for each of them; the session dependency (blocking I/O at close) stays synchronous.

**Transaction slots.** A request's session is opened only once the request holds a transaction slot
(:func:`transaction_slot`): taken on the event loop before the session exists, given back at the
end of the request, after the session closed (a write session closes right after the route's
commit), so what follows a commit inside the request (a training's send and its ``enqueued_at``
mark) runs inside the slot. There are as many slots as the database can run transactions at once:
one on SQLite (every transaction there begins with ``BEGIN IMMEDIATE``, the one write lock) and the
pool's size plus its overflow elsewhere. So a request never holds a connection or the write lock
while it queues for another one: requests wait for a slot on the loop, holding no thread, no
connection and no lock, and one whose wait exceeds the pool's timeout is refused with 503
``database_unavailable`` and ``Retry-After`` before anything was read or reserved. The slot is
cached per request (FastAPI caches a dependency per request), so a route with both a read and a
write session holds one slot. Sizing the request *threads* to the database instead deadlocks on
SQLite (a request waiting for a thread to commit holds the write lock the only thread waits on);
the slot bounds the transactions and leaves the threads alone (docs/design.md §4).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.auth import Principal, RevocationList, TokenError, decode_token_cached
from app.config import Settings
from app.errors import (
    AdminRequired,
    BatchTooLarge,
    DatabaseUnavailable,
    InvalidToken,
    MissingToken,
    ScopeRequired,
    TokenExpired,
    TokenRevoked,
    WrongSubject,
)
from app.schemas.common import DEFAULT_PAGE_SIZE, MAX_OFFSET, MAX_PAGE_SIZE, PageRequest
from app.services.revocations import revoked_ids
from app.services.unit_of_work import commit

__all__ = [
    "SettingsDep",
    "SessionDep",
    "WriteSessionDep",
    "CurrentPrincipal",
    "AdminPrincipal",
    "PageQ",
    "page_query",
    "get_session",
    "get_write_session",
    "transaction_slot",
    "slot_capacity",
    "run_in_app_session",
    "verify_bearer",
    "revocation_list",
    "fresh_revocations",
    "refuse_revoked",
    "require_user_access",
    "require_ingest_access",
    "require_item_writer",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="Signed bearer token (`privrec issue-token`).")


async def get_app_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


DEFAULT_SLOT_TIMEOUT_S = 30.0  # SQLAlchemy's pool timeout, for a pool that names none
SLOT_RETRY_AFTER_S = 2  # seconds a refused request is told to wait (as for a pool timeout)


def slot_capacity(bind: Any) -> int | None:
    """How many requests may hold a transaction on ``bind`` (an engine) at once: 1 on SQLite
    (every transaction takes the write lock), the pool's size plus its overflow otherwise; None
    (no bound) without an engine or for a pool without a bound."""
    if bind is None:
        return None
    if bind.dialect.name == "sqlite":
        return 1
    pool = bind.pool
    size = getattr(pool, "size", None)
    overflow = getattr(pool, "_max_overflow", None)  # QueuePool's bound (no public accessor)
    if not callable(size) or not isinstance(overflow, int) or overflow < 0:
        return None
    return int(size()) + overflow


@dataclass
class _Slots:
    """The transaction slots of one app's session factory: one semaphore per event loop (a
    test client may run each request on a loop of its own)."""

    maker: Any
    capacity: int | None
    timeout_s: float
    by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = field(
        default_factory=weakref.WeakKeyDictionary)

    def semaphore(self, capacity: int) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with _slots_lock:
            semaphore = self.by_loop.get(loop)
            if semaphore is None:
                semaphore = self.by_loop[loop] = asyncio.Semaphore(capacity)
            return semaphore


_slots_lock = threading.Lock()


def _slots(app: Any) -> _Slots:
    """``app``'s slots, derived from its session factory's engine (bare test apps have no settings)."""
    maker = app.state.sessionmaker
    slots: _Slots | None = getattr(app.state, "transaction_slots", None)
    if slots is not None and slots.maker is maker:
        return slots
    with _slots_lock:
        slots = getattr(app.state, "transaction_slots", None)
        if slots is None or slots.maker is not maker:
            bind = getattr(maker, "kw", {}).get("bind")
            timeout = getattr(getattr(bind, "pool", None), "timeout", None)
            slots = app.state.transaction_slots = _Slots(
                maker, slot_capacity(bind), float(timeout()) if callable(timeout) else DEFAULT_SLOT_TIMEOUT_S)
        return slots


async def transaction_slot(request: Request) -> AsyncIterator[None]:
    """Hold one of the database's transaction slots for the rest of the request (see the module
    docstring); 503 ``database_unavailable`` with ``Retry-After`` when none comes free within the
    pool's timeout, before the request's session is opened."""
    slots = _slots(request.app)
    if slots.capacity is None:
        yield
        return
    semaphore = slots.semaphore(slots.capacity)
    try:
        async with asyncio.timeout(slots.timeout_s):
            await semaphore.acquire()
    except TimeoutError:
        log.warning("no transaction slot free within %.0f s (%d slots): refused with 503",
                    slots.timeout_s, slots.capacity)
        raise DatabaseUnavailable("the database is busy (no transaction slot free in time); retry later",
                                  headers={"Retry-After": str(SLOT_RETRY_AFTER_S)}) from None
    try:
        yield
    finally:
        semaphore.release()


SlotDep = Annotated[None, Depends(transaction_slot)]


def get_session(request: Request, _slot: SlotDep) -> Iterator[Session]:
    """A session per request, opened once the request holds a transaction slot; services commit
    explicitly, anything uncommitted is rolled back."""
    session = request.app.state.sessionmaker()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def get_write_session(request: Request, _slot: SlotDep) -> Iterator[Session]:
    """A session for a writing route, opened once the request holds a transaction slot: its
    unit of work commits once, right after the route returned without error (before the
    response is sent), then runs its after-commit actions (:mod:`app.services.unit_of_work`)
    inside the same slot; on any error everything is rolled back."""
    session = request.app.state.sessionmaker()
    try:
        yield session
        commit(session)
    finally:
        session.rollback()
        session.close()


# scope="function": the commit runs when the route returns, so a failed commit is the response
WriteSessionDep = Annotated[Session, Depends(get_write_session, scope="function")]


async def run_in_app_session(app: Any, work: Callable[[Session], T]) -> T:
    """Run ``work(session)`` in one worker thread with a session of ``app``'s database (the
    caller's context variables, e.g. the request id, go with it). A process-wide pool of
    max(2, DB_POOL_SIZE) threads runs these calls, so threads neither wait on the connection
    pool nor crowd the interpreter lock; the event loop's own executor hop costs about two
    thirds of anyio's worker-thread call. Nothing is committed."""

    def call() -> T:
        session = app.state.sessionmaker()
        try:
            return work(session)
        finally:
            session.rollback()
            session.close()

    executor = _read_executor(max(2, app.state.settings.db_pool_size))
    return await asyncio.get_running_loop().run_in_executor(executor, contextvars.copy_context().run, call)


_executors: dict[int, ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _read_executor(threads: int) -> ThreadPoolExecutor:
    """The process's thread pool of this size for :func:`run_in_app_session` (created once)."""
    executor = _executors.get(threads)
    if executor is None:
        with _executors_lock:
            executor = _executors.setdefault(threads, ThreadPoolExecutor(threads, thread_name_prefix="privrec-read"))
    return executor


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Verify the bearer token; 401 when missing, malformed, tampered with, expired or revoked.
    (The settings are read from the app, not through ``SettingsDep``: one dependency fewer to
    solve on every authenticated request.)"""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise MissingToken("a bearer token is required")
    return await verify_bearer(request.app, credentials.credentials)


async def verify_bearer(app: Any, token: str) -> Principal:
    """The principal of a bearer token (its signature check cached once verified; its revocation
    checked on every call against a list at most ``REVOCATION_REFRESH_S`` old); 401 when it is
    malformed, tampered with, expired or revoked."""
    settings = app.state.settings
    try:
        principal = decode_token_cached(token, secret=settings.secret_key, algorithm=settings.jwt_algorithm,
                                        max_lifetime_s=settings.max_token_ttl_s)
    except TokenError as exc:
        refusal = TokenExpired if "expired" in str(exc) else InvalidToken
        raise refusal(str(exc)) from None
    await refuse_revoked(app, principal.token_id)
    return principal


async def refuse_revoked(app: Any, token_id: str) -> None:
    """401 ``token_revoked`` when ``token_id`` is on the revocation list."""
    if (await fresh_revocations(app)).is_revoked(token_id):
        raise TokenRevoked("this token was revoked")


def revocation_list(app: Any) -> RevocationList:
    """The revocation list of ``app`` in this process (``app.state.revocations``; created on first
    use with the default refresh interval)."""
    revocations: RevocationList | None = getattr(app.state, "revocations", None)
    if revocations is None:
        revocations = app.state.revocations = RevocationList()
    return revocations


async def fresh_revocations(app: Any) -> RevocationList:
    """``app``'s revocation list, reloaded from the database first when it is stale."""
    revocations = revocation_list(app)
    if not revocations.is_fresh():
        await run_in_app_session(app, lambda session: revocations.reload(lambda: revoked_ids(session)))
    return revocations


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


async def get_admin(principal: CurrentPrincipal) -> Principal:
    """403 unless the token carries the admin scope."""
    if not principal.is_admin:
        raise AdminRequired("this route needs an admin token")
    return principal


AdminPrincipal = Annotated[Principal, Depends(get_admin)]


def require_user_access(principal: Principal, user_id: str) -> None:
    """403 unless the caller is ``user_id`` or a service allowed to act for users."""
    if not principal.may_act_for(user_id):
        raise WrongSubject("the token may not act for this user")


def require_batch_within(n_rows: int, settings: Settings) -> None:
    """413 ``batch_too_large`` when a batch holds more rows than ``settings.max_batch_size``."""
    if n_rows > settings.max_batch_size:
        raise BatchTooLarge(
            f"a batch holds at most {settings.max_batch_size} rows; got {n_rows}",
            details={"max_rows": settings.max_batch_size, "rows": n_rows})


def require_ingest_access(principal: Principal, user_id: str) -> None:
    """403 unless the caller is ``user_id`` or a service with the ``ingest`` scope."""
    if not principal.may_ingest_for(user_id):
        raise WrongSubject("the token may not write this user's ratings")


def require_item_writer(principal: Principal) -> None:
    """403 unless the caller may edit the public item catalogue."""
    if not principal.may_manage_items:
        raise ScopeRequired("editing items needs a service token with the ingest scope or an admin token")


OffsetQ = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Entries to skip.")]
LimitQ = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description=f"Page size (at most {MAX_PAGE_SIZE:,}).")]


def page_query(default_limit: int = DEFAULT_PAGE_SIZE) -> Callable[..., Awaitable[PageRequest]]:
    """The paging dependency of every list route: ``offset`` and ``limit`` query parameters
    (``limit`` defaults to ``default_limit``), validated against MAX_OFFSET and MAX_PAGE_SIZE."""

    async def page(offset: OffsetQ = 0, limit: LimitQ = default_limit) -> PageRequest:
        return PageRequest(offset=offset, limit=limit)

    return page


PageQ = Annotated[PageRequest, Depends(page_query())]
