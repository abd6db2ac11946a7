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


POOL_CONNECT_WAIT_S = 1.0
"""How long a request waits for a first pooled connection when the pool holds none (the database
may be down: the pool retries in the background, the request gets a fast 503)."""
POOL_TIMEOUT_S = 30.0
"""How long a request waits for a busy pool's next free connection (SQLAlchemy's pool_timeout)."""


async def read_rows_async(pool: AsyncConnectionPool, statement: Executable, params: Mapping[str, Any]) -> Rows:
    """All rows of ``statement`` in one round trip on ``pool`` (PostgreSQL), retried once when the
    connection turned out dead (the pool discards a broken connection when it comes back). A pool
    that holds no connection after POOL_CONNECT_WAIT_S, or none free within POOL_TIMEOUT_S,
    raises SQLAlchemy's ``OperationalError`` (503): never a second pool, so the number of
    connections stays bounded under overload."""
    sql = _driver_sql_for(_PG_DIALECT, statement)
    try:
        return await _rows_async(pool, sql, params)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return await _rows_async(pool, sql, params)


async def _rows_async(pool: AsyncConnectionPool, sql: str, params: Mapping[str, Any]) -> Rows:
    conn = await _connection(pool, sql, params)
    try:
        cursor = await conn.execute(sql, params)
        return await cursor.fetchall()
    except psycopg.Error as exc:  # re-raised as SQLAlchemy's: OperationalError stays a 503
        raise DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=conn.broken) from exc
    finally:
        await pool.putconn(conn)


async def _connection(pool: AsyncConnectionPool, sql: str, params: Mapping[str, Any]) -> psycopg.AsyncConnection:
    """A pooled connection, or SQLAlchemy's OperationalError (see :func:`read_rows_async`)."""
    try:
        return await pool.getconn(timeout=POOL_CONNECT_WAIT_S)
    except PoolTimeout as exc:
        if not pool.get_stats().get("pool_size", 0):  # nothing connected: the database is not reachable
            raise DBAPIError.instance(sql, params, exc, psycopg.Error) from exc
    try:  # every connection is busy: wait for one as any pooled request does
        return await pool.getconn(timeout=POOL_TIMEOUT_S - POOL_CONNECT_WAIT_S)
    except PoolTimeout as exc:
        raise DBAPIError.instance(sql, params, exc, psycopg.Error) from exc


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
