"""One statement, one database round trip: the serving hot path's read.

A pooled session costs a pre-ping, a BEGIN and a ROLLBACK around every query (four round trips
for one SELECT). A single SELECT is its own snapshot, so on PostgreSQL the hot path runs it on
an autocommit engine beside the session's (:func:`app.db.session.get_read_engine`); other
databases (the embedded SQLite) use the session itself.

On PostgreSQL the statement is compiled once to the driver's SQL and run on the pooled
connection's driver cursor: SQLAlchemy's per-execution machinery (compiled-cache lookup,
execution context, result wrapping) cost about as much CPU as the query itself. Driver errors
are re-raised as SQLAlchemy's (``OperationalError`` stays a 503), with a dead connection
invalidated so the one retry gets a fresh one.

:func:`read_rows_async` is the same read on the event loop, on a pool of autocommit psycopg
connections (:func:`app.db.session.async_read_pool`), so the request needs no worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import Engine, Executable
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.db.session import get_read_engine

__all__ = ["read_rows", "read_rows_async"]


Rows = Sequence[Sequence[Any]]  # SQLAlchemy rows or the driver's tuples: indexed by position


def read_rows(session: Session, statement: Executable, params: Mapping[str, Any]) -> Rows:
    """All rows of ``statement`` in one round trip (retried once on a dead pooled connection)."""
    bind = session.get_bind()
    if bind.dialect.name != "postgresql" or not isinstance(bind, Engine):  # a session bound to one connection reads on it
        return session.execute(statement, params).all()
    engine = get_read_engine(bind)
    try:
        return _rows(engine, statement, params)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return _rows(engine, statement, params)  # the pool dropped the dead connection


def _rows(engine: Engine, statement: Executable, params: Mapping[str, Any]) -> Rows:
    sql = _driver_sql(engine, statement)
    dbapi_error = engine.dialect.loaded_dbapi.Error
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        try:
            return driver.execute(sql, params).fetchall()  # type: ignore[union-attr]  # psycopg's connection
        except dbapi_error as exc:
            dead = bool(getattr(driver, "closed", False))
            if dead:
                conn.invalidate()
            raise DBAPIError.instance(sql, params, exc, dbapi_error, connection_invalidated=dead) from exc


POOL_WAIT_S = 1.0
"""How long :func:`read_rows_async` waits for a pooled connection before giving up (None)."""


async def read_rows_async(pool: AsyncConnectionPool, statement: Executable, params: Mapping[str, Any]) -> Rows | None:
    """All rows of ``statement`` in one round trip on ``pool`` (PostgreSQL), retried once when the
    connection turned out dead (the pool discards a broken connection when it comes back). None
    when no connection came within POOL_WAIT_S (the pool cannot connect, or every connection is
    busy): the caller reads through its session instead, which fails fast with a 503 when the
    database is down (the pool itself would keep a request waiting while it retries)."""
    try:
        return await _rows_async(pool, statement, params)
    except PoolTimeout:
        return None
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return await _rows_async(pool, statement, params)


async def _rows_async(pool: AsyncConnectionPool, statement: Executable, params: Mapping[str, Any]) -> Rows:
    sql = _driver_sql_for(_PG_DIALECT, statement)
    async with pool.connection(timeout=POOL_WAIT_S) as conn:
        try:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall()
        except psycopg.Error as exc:  # re-raised as SQLAlchemy's: OperationalError stays a 503
            raise DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=conn.broken) from exc


_PG_DIALECT = PGDialect_psycopg()
_compiled: dict[tuple[int, str], tuple[Executable, str]] = {}  # the statement is kept: its id stays its own


def _driver_sql(engine: Engine, statement: Executable) -> str:
    """``statement`` as the driver's SQL (named parameters in its style), compiled once."""
    return _driver_sql_for(engine.dialect, statement)


def _driver_sql_for(dialect: Any, statement: Executable) -> str:
    key = (id(statement), dialect.name)
    entry = _compiled.get(key)
    if entry is None or entry[0] is not statement:
        entry = _compiled[key] = (statement, str(statement.compile(dialect=dialect)))  # type: ignore[attr-defined]  # a ClauseElement
    return entry[1]
