"""Small SQL helpers shared by the stores: a dialect's INSERT with ON CONFLICT, PostgreSQL
array literals, chunking for IN lists and multi-row INSERTs, the rows a DML statement matched,
the session's driver connection (raw cursors) and a statement's SQL for it. PostgreSQL's binary
COPY and savepoint helpers are :mod:`app.db.stores.postgres_copy`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import CursorResult, Result, TextClause
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

__all__ = ["CHUNK", "insert_for", "pg_array", "chunks", "rows_matched", "driver_connection", "driver_sql"]

CHUNK = 1000  # rows per INSERT statement / ids per IN list (6 parameters a row: well under SQLite's 32,766)


def insert_for(session: Session, table: Any) -> Any:
    """A dialect-specific INSERT that supports ON CONFLICT (PostgreSQL and SQLite)."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database dialect {name!r}")


def pg_array(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal (much faster to send than a list adapted element by element).

    Numbers are written with ``repr``; strings are double-quoted with ``\\`` and ``"`` escaped.
    """
    if values and isinstance(values[0], str):
        joined = '","'.join(values)  # one C-level join; escaping (rare) only when needed
        if "\\" in joined or joined.count('"') != 2 * (len(values) - 1):
            joined = '","'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
        return '{"' + joined + '"}'
    return "{" + ",".join(map(repr, values)) + "}"


def chunks(seq: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    """Consecutive slices of ``seq`` of at most ``size`` elements."""
    for start in range(0, len(seq), size):
        yield seq[start:start + size]


def rows_matched(result: Result[*tuple[Any, ...]]) -> int:
    """Rows an UPDATE or DELETE matched (its cursor's ``rowcount``; 0 when the driver reports none).
    ``Session.execute`` is typed as returning any ``Result``; a DML statement's is a ``CursorResult``."""
    if not isinstance(result, CursorResult):
        raise TypeError("rows_matched needs the result of an UPDATE or DELETE statement")
    return result.rowcount or 0


def driver_connection(session: Session) -> Any:
    """The DBAPI driver's own connection under the session's (psycopg's for COPY, sqlite3's)."""
    driver = session.connection().connection.driver_connection
    if driver is None:
        raise RuntimeError("the session's connection has no live driver connection")
    return driver


def driver_sql(stmt: TextClause) -> str:
    """``stmt``'s SQL for the driver's own cursor (psycopg): ``:name`` becomes ``%(name)s`` and
    ``%`` doubles. Hot statements run there: no SQL compilation, plain tuples instead of rows."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", stmt.text.replace("%", "%%"))
