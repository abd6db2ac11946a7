"""One statement, one database round trip: the serving hot path's read.

A pooled session costs a pre-ping, a BEGIN and a ROLLBACK around every query (four round trips
for one SELECT). A single SELECT is its own snapshot, so on PostgreSQL the hot path runs it on
an autocommit engine beside the session's (:func:`app.db.session.get_read_engine`); other
databases (the embedded SQLite) use the session itself.

On PostgreSQL the statement is compiled once to the driver's SQL and run on a binary-result
driver cursor kept with the pooled connection: SQLAlchemy's per-execution machinery
(compiled-cache lookup, execution context, result wrapping) cost about as much CPU as the query
itself. Driver errors
are re-raised as SQLAlchemy's (``OperationalError`` stays a 503), with a dead connection
invalidated so the one retry gets a fresh one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, Executable
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.db.session import get_read_engine

__all__ = ["read_rows"]


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
    pooled = engine.raw_connection()  # the pool's checkout without a Connection around it
    try:
        try:
            return _cursor(pooled).execute(sql, params).fetchall()
        except dbapi_error as exc:
            dead = bool(getattr(pooled.driver_connection, "closed", False))
            if dead:
                pooled.invalidate()
            raise DBAPIError.instance(sql, params, exc, dbapi_error, connection_invalidated=dead) from exc
    finally:
        pooled.close()


_CURSOR = "privrec_hot_read_cursor"


def _cursor(pooled: Any) -> Any:
    """The pooled connection's own binary-result cursor, kept in the pool record's ``info`` (which
    goes with the connection when the pool drops it): no cursor and adapters map to build per
    read, and no text parsing of the numbers."""
    cursor = pooled.info.get(_CURSOR)
    if cursor is None:
        cursor = pooled.info[_CURSOR] = pooled.driver_connection.cursor(binary=True)
    return cursor


_compiled: dict[tuple[int, str], tuple[Executable, str]] = {}  # the statement is kept: its id stays its own


def _driver_sql(engine: Engine, statement: Executable) -> str:
    """``statement`` as the driver's SQL (named parameters in its style), compiled once."""
    key = (id(statement), engine.dialect.name)
    entry = _compiled.get(key)
    if entry is None or entry[0] is not statement:
        entry = _compiled[key] = (statement, str(statement.compile(dialect=engine.dialect)))  # type: ignore[attr-defined]  # a ClauseElement
    return entry[1]
