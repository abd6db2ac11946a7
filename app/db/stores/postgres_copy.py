"""PostgreSQL's bulk paths for the stores: binary ``COPY`` data of rating rows (no text
formatting), a COPY whose writes reach the server before client work goes on, and statements
tried inside a savepoint that a unique violation rolls back alone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from psycopg.copy import LibpqWriter
from psycopg.errors import UniqueViolation

__all__ = ["PG_COPY_TRIPLET", "PG_COPY_DATED", "PG_EPOCH_US", "PG_COPY_HEADER", "pg_copy_triplets", "pg_copy_ratings",
           "pg_unless_unique_violation", "pg_returning_unless_unique_violation", "pg_flushed_copy"]

# PostgreSQL binary COPY of (bigint, bigint, float8) rows: a field count, then length + value per field
PG_COPY_TRIPLET = np.dtype(
    [("n", ">i2"), ("l1", ">i4"), ("u", ">i8"), ("l2", ">i4"), ("i", ">i8"), ("l3", ">i4"), ("v", ">f8")]
)
# the same with a fourth field, a timestamptz (int8 microseconds since 2000-01-01 UTC)
PG_COPY_DATED = np.dtype(
    [("n", ">i2"), ("l1", ">i4"), ("u", ">i8"), ("l2", ">i4"), ("i", ">i8"), ("l3", ">i4"), ("v", ">f8"),
     ("l4", ">i4"), ("t", ">i8")]
)
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 UTC in microseconds since 1970-01-01 UTC
PG_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature (11), flags (4), extension length (4)
_PG_COPY_TRAILER = b"\xff\xff"  # field count -1


def pg_copy_triplets(u: np.ndarray, i: np.ndarray, v: np.ndarray) -> bytes:
    """``COPY ... FROM STDIN (FORMAT BINARY)`` data of the rows (u[k], i[k], v[k]): no text formatting."""
    rows = np.empty(len(u), dtype=PG_COPY_TRIPLET)
    rows["n"] = 3
    rows["l1"] = rows["l2"] = rows["l3"] = 8
    rows["u"], rows["i"], rows["v"] = u, i, v
    return PG_COPY_HEADER + rows.tobytes() + _PG_COPY_TRAILER


# the same for ratings rows: (int4 data set, int8 user, int8 item, float8 value, timestamptz created, updated)
_PG_COPY_RATING = np.dtype(
    [("n", ">i2"), ("l0", ">i4"), ("ds", ">i4"), ("l1", ">i4"), ("u", ">i8"), ("l2", ">i4"), ("i", ">i8"),
     ("l3", ">i4"), ("v", ">f8"), ("l4", ">i4"), ("created", ">i8"), ("l5", ">i4"), ("updated", ">i8")]
)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # binary timestamptz: microseconds since this instant


def pg_copy_ratings(dataset_id: int, u: np.ndarray, i: np.ndarray, v: np.ndarray, now: datetime) -> bytes:
    """``COPY ratings (dataset_id, user_id, item_id, value, created_at, updated_at) FROM STDIN
    (FORMAT BINARY)`` data: the rows (u[k], i[k], v[k]) of one data set, created and updated ``now``
    (timezone-aware)."""
    rows = np.empty(len(u), dtype=_PG_COPY_RATING)
    rows["n"] = 6
    rows["l0"] = 4
    rows["l1"] = rows["l2"] = rows["l3"] = rows["l4"] = rows["l5"] = 8
    rows["ds"], rows["u"], rows["i"], rows["v"] = dataset_id, u, i, v
    rows["created"] = rows["updated"] = (now - _PG_EPOCH) // timedelta(microseconds=1)
    return PG_COPY_HEADER + rows.tobytes() + _PG_COPY_TRAILER


def pg_unless_unique_violation(cursor: Any, work: Callable[[], object]) -> bool:
    """Run ``work`` (statements on the psycopg ``cursor``) inside a savepoint: True when it ran,
    False when it hit a unique violation, in which case it is rolled back (the rest of the
    transaction stays)."""
    cursor.execute("SAVEPOINT unless_unique_violation")
    try:
        work()
    except UniqueViolation:
        cursor.execute("ROLLBACK TO SAVEPOINT unless_unique_violation")
        return False
    cursor.execute("RELEASE SAVEPOINT unless_unique_violation")
    return True


def pg_returning_unless_unique_violation(cursor: Any, statement: str, params: dict[str, Any],
                                         meanwhile: Callable[[], object]) -> list[tuple[Any, ...]] | None:
    """Run ``statement`` (psycopg SQL returning rows) on ``cursor`` inside a savepoint, sent with
    the savepoint in one round trip, and call ``meanwhile`` (client work) while PostgreSQL runs it.
    Returns its rows; ``None`` where it hit a unique violation (rolled back, the rest of the
    transaction stays). Where ``meanwhile`` raises, the statement is rolled back and the exception
    propagates."""
    failed: BaseException | None = None
    try:
        with cursor.connection.pipeline():
            cursor.connection.execute("SAVEPOINT returning_unless_unique_violation")
            cursor.execute(statement, params)  # sent: the server runs it while the client works
            # any exception is held until the pipeline is in sync: raised inside, psycopg would log
            # the statement's error too (which may name a row)
            try:
                meanwhile()
            except BaseException as exc:  # noqa: BLE001 - raised below
                failed = exc
    except UniqueViolation:
        cursor.execute("ROLLBACK TO SAVEPOINT returning_unless_unique_violation")
        if failed is not None:
            raise failed from None
        return None
    if failed is not None:
        cursor.execute("ROLLBACK TO SAVEPOINT returning_unless_unique_violation")
        raise failed
    rows: list[tuple[Any, ...]] = cursor.fetchall()
    cursor.execute("RELEASE SAVEPOINT returning_unless_unique_violation")
    return rows


def pg_flushed_copy(cursor: Any, statement: str) -> Any:
    """``cursor.copy(statement)`` whose ``write`` returns once the data is with the server (not
    left in the driver's buffer): client work after a write runs while PostgreSQL takes it in."""
    return cursor.copy(statement, writer=LibpqWriter(cursor, flush_threshold=0))
