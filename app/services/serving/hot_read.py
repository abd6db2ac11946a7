"""One statement, one database round trip: the serving hot path's read.

A pooled session costs a pre-ping, a BEGIN and a ROLLBACK around every query (four round trips
for one SELECT). A single SELECT is its own snapshot, so on PostgreSQL the hot path runs it on
an autocommit engine beside the session's (:func:`app.db.session.get_read_engine`); other
databases (the embedded SQLite) use the session itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, Executable, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.db.session import get_read_engine

__all__ = ["read_rows"]


Rows = Sequence[Row[*tuple[Any, ...]]]


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
    with engine.connect() as conn:
        return conn.execute(statement, params).all()
