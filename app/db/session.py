"""Engines and sessions: one engine per database URL, one transaction per unit of work.

SQLite (embedded mode) runs in WAL mode with foreign keys on and a busy timeout, and every
transaction starts with ``BEGIN IMMEDIATE``: writers are serialised by SQLite itself, which is
the serialising lock the privacy ledger relies on (PostgreSQL uses ``SELECT ... FOR UPDATE``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.errors import WriteConflict

__all__ = [
    "EngineOptions",
    "DEFAULT_ENGINE_OPTIONS",
    "engine_options",
    "normalise_url",
    "get_engine",
    "get_sessionmaker",
    "get_read_engine",
    "session_scope",
    "open_database",
    "dispose_engines",
    "is_sqlite",
    "is_sqlite_url",
    "is_postgres",
    "is_lock_conflict",
    "retry_lock_conflicts",
    "LOCK_CONFLICT_ATTEMPTS",
    "ride_out_outage",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

_lock = threading.Lock()
PING_AFTER_IDLE_S = 1.0  # a pooled PostgreSQL connection idle this long is pinged before use
_CHECKED_IN_AT = "privrec.checked_in_at"  # ConnectionRecord.info key: monotonic seconds
_engines: dict[str, Engine] = {}
_makers: dict[str, sessionmaker[Session]] = {}
_read_engines: dict[str, Engine] = {}


def normalise_url(url: str) -> str:
    """Use the psycopg 3 driver for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _prepare_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # pragma: no cover - exercised via engine use
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # pragma: no cover - exercised via engine use
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _ping_after_idle(engine: Engine, idle_seconds: float) -> None:
    """Pessimistic disconnect handling only where it pays: a connection that sat in the pool for
    ``idle_seconds`` or more (where a server restart, an idle timeout or a network drop leaves dead
    connections) is pinged on checkout, and a failed ping empties the pool and connects afresh (as
    ``pool_pre_ping`` does). One just returned by a busy service skips that round trip; should it
    be dead all the same, its statement fails once and SQLAlchemy invalidates the pool (optimistic
    handling), so the next checkouts connect afresh."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn, record) -> None:  # pragma: no cover - exercised via engine use
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, _proxy) -> None:  # pragma: no cover - exercised via engine use
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        if checked_in_at is None or time.monotonic() - checked_in_at < idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as err:
            raise exc.InvalidatePoolError(f"pooled connection failed its ping: {err.__class__.__name__}") from err


@dataclass(frozen=True)
class EngineOptions:
    """How an engine is built: passed in by whoever owns the settings (app factory, CLI, worker),
    never looked up. The defaults are :class:`~app.config.Settings`' defaults (tools and tests)."""

    echo: bool = False
    pool_size: int = 10
    sqlite_busy_timeout_ms: int = 30_000


DEFAULT_ENGINE_OPTIONS = EngineOptions()


def engine_options(settings: Settings) -> EngineOptions:
    """The engine options ``settings`` ask for."""
    return EngineOptions(echo=settings.db_echo, pool_size=settings.db_pool_size,
                         sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms)


def _create_engine(url: str, options: EngineOptions) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            echo=options.echo,
            connect_args={"check_same_thread": False, "timeout": options.sqlite_busy_timeout_ms / 1000},
        )
        _prepare_sqlite(engine, options.sqlite_busy_timeout_ms)
        return engine
    engine = create_engine(
        url,
        echo=options.echo,
        pool_size=options.pool_size,
        max_overflow=options.pool_size,
    )
    _ping_after_idle(engine, PING_AFTER_IDLE_S)
    return engine


def get_engine(url: str, options: EngineOptions = DEFAULT_ENGINE_OPTIONS) -> Engine:
    """The engine for ``url``, created with ``options`` on first use and cached per URL (a later
    caller's options do not rebuild it)."""
    key = normalise_url(url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _create_engine(key, options)
        return engine


def get_sessionmaker(url: str, options: EngineOptions = DEFAULT_ENGINE_OPTIONS) -> sessionmaker[Session]:
    """The (cached) session factory bound to :func:`get_engine` (``expire_on_commit=False``)."""
    key = normalise_url(url)
    engine = get_engine(key, options)
    with _lock:
        maker = _makers.get(key)
        if maker is None:
            maker = _makers[key] = sessionmaker(bind=engine, expire_on_commit=False)
        return maker


@contextmanager
def session_scope(url: str, options: EngineOptions = DEFAULT_ENGINE_OPTIONS) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any exception, always close."""
    session = get_sessionmaker(url, options)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def open_database(settings: Settings, url: str | None = None) -> str:
    """The database URL a service entry point works on (``url``, e.g. a test's own database, else
    the one ``settings`` name), with its engine built from ``settings``' options: the helpers it
    calls then take that URL and reuse the cached engine."""
    resolved = url or settings.database_url
    get_engine(resolved, engine_options(settings))
    return resolved


def get_read_engine(engine: Engine) -> Engine:
    """A PostgreSQL engine for single-statement reads on hot paths, beside ``engine`` (same URL
    and pool size): autocommit (no BEGIN/ROLLBACK round trips; one statement is one snapshot),
    no pre-ping and no reset on return, so a read is exactly one round trip. Callers retry once
    when a pooled connection turns out to be dead (``DBAPIError.connection_invalidated``)."""
    key = engine.url.render_as_string(hide_password=False)
    with _lock:
        read = _read_engines.get(key)
        if read is None:
            size = engine.pool.size() if hasattr(engine.pool, "size") else 5
            read = _read_engines[key] = create_engine(
                engine.url, isolation_level="AUTOCOMMIT", pool_pre_ping=False, pool_reset_on_return=None,
                pool_size=size, max_overflow=size)
        return read


def dispose_engines() -> None:
    """Close every pooled connection and forget the engines (tests, forked workers)."""
    with _lock:
        for engine in [*_engines.values(), *_read_engines.values()]:
            engine.dispose()
        _engines.clear()
        _read_engines.clear()
        _makers.clear()


def is_sqlite(session_or_engine: Session | Engine) -> bool:
    bind = session_or_engine.get_bind() if isinstance(session_or_engine, Session) else session_or_engine
    return bind.dialect.name == "sqlite"


def is_sqlite_url(url: str) -> bool:
    """Whether the database URL names SQLite (from the URL alone: nothing is opened)."""
    return make_url(url).get_backend_name() == "sqlite"


def is_postgres(session_or_engine: Session | Engine) -> bool:
    bind = session_or_engine.get_bind() if isinstance(session_or_engine, Session) else session_or_engine
    return bind.dialect.name == "postgresql"


StoreT = TypeVar("StoreT")


def store_for(session: Session, stores: Mapping[str, Callable[[Session], StoreT]]) -> StoreT:
    """The store of ``session``'s database, picked from ``stores`` (dialect name -> implementation)
    once, when a use case asks for it."""
    name = session.get_bind().dialect.name
    make = stores.get(name)
    if make is None:
        raise RuntimeError(f"unsupported database dialect {name!r}")
    return make(session)


# PostgreSQL's SQLSTATEs of a transaction chosen as a deadlock's victim or failing serialisation:
# the transaction did nothing durable and may simply run again.
_LOCK_CONFLICT_STATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
LOCK_CONFLICT_ATTEMPTS = 5  # runs of one transaction before its caller gets 503 write_conflict
_CONFLICT_BACKOFF_S = 0.02  # the first retry waits up to this long (full jitter), doubling after


def is_lock_conflict(error: BaseException) -> bool:
    """True for a deadlock victim or a serialisation failure (the transaction may run again)."""
    state = getattr(getattr(error, "orig", None), "sqlstate", None)
    return isinstance(error, exc.DBAPIError) and state in _LOCK_CONFLICT_STATES


def retry_lock_conflicts(session: Session, work: Callable[[], T], *, attempts: int = LOCK_CONFLICT_ATTEMPTS) -> T:
    """Run ``work`` (the whole unit of work on ``session``, nothing staged before it) and, when
    PostgreSQL picks it as a deadlock's victim or fails it for serialisation, roll the session
    back and run it again, at most ``attempts`` times with a jittered exponential pause. Then 503
    ``write_conflict`` with ``Retry-After`` (never a raw 500, never "database not reachable")."""
    for attempt in range(attempts):
        try:
            return work()
        except exc.DBAPIError as error:
            if not is_lock_conflict(error):
                raise
            session.rollback()
            if attempt + 1 == attempts:
                raise WriteConflict("concurrent writes kept conflicting with this one; nothing was written, "
                                    "retry", headers={"Retry-After": "1"}) from None
            time.sleep(random.uniform(0.0, _CONFLICT_BACKOFF_S * 2**attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def ride_out_outage(work: Callable[[], T], *, within_s: float, first_pause_s: float = 0.5,
                    max_pause_s: float = 5.0) -> T:
    """Run ``work`` (which opens its own session) and, while the database is unreachable (a
    restart, a network drop: ``OperationalError`` / ``InterfaceError``), pause and run it again,
    the pauses doubling up to ``max_pause_s``, for at most ``within_s`` seconds; then the last
    error is raised. For a long job (a training run) that must ride out a short outage."""
    deadline = time.monotonic() + within_s
    pause = first_pause_s
    while True:
        try:
            return work()
        except (exc.OperationalError, exc.InterfaceError) as error:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("database unreachable (%s); retrying in %.1f s", type(error).__name__, pause)
            time.sleep(pause)
            pause = min(2 * pause, max_pause_s)
