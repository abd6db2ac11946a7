"""A run's training data as user partitions, each read by the cluster task that uses it (issue 28).

On a cluster the run's driver (the Celery worker) never reads the private ratings. It opens one
PostgreSQL transaction whose snapshot it exports (:func:`exported_snapshot`), reads only public
inputs there (the catalogue, DP-CMF's public sources) and hands the cluster one
:class:`PostgresPartition` per partition: a picklable reader that a Dask task runs on a worker, which
imports that snapshot (``SET TRANSACTION SNAPSHOT``, read only) and ``COPY``-s out its users' rows
(a range of user row ids, :func:`user_ranges`) through the same loader functions as the in-process read
(:func:`app.db.loaders.read_partition_rows`). So every partition sees the database as it was at
one instant, the partitions together are exactly what the in-process read gives, and a task the
cluster recomputes reads the same rows again. The driver holds the snapshot's transaction open until
training ends (read only; it holds back only vacuum of rows changed meanwhile).

The readers carry the database URL (credentials included): it crosses to the workers inside the
task's arguments, under the cluster's TLS, and is never in a key or a log line.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from app.core.algorithms import Algorithm
from app.core.data.partitioned import PartitionedRatings
from app.core.data.ratings import Ratings
from app.db.loaders import item_index, public_data, public_users_source, read_partition_rows, settle_run_cohorts
from app.db.models import Dataset, User
from app.db.session import is_sqlite_url, normalise_url, session_scope
from app.db.stores.ratings import UserPartition

__all__ = ["PostgresPartition", "Snapshot", "exported_snapshot", "partitioned_inputs", "user_ranges", "id_ranges",
           "PARTITIONED_KINDS"]

#: the data kinds a partitioned read serves (the distributable algorithms' kinds)
PARTITIONED_KINDS = ("ratings", "ratings+public")
_SNAPSHOT_ID = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9A-F]+)?$")


@dataclass(frozen=True)
class Snapshot:
    """An exported snapshot and the driver's session inside it (read only)."""

    session: Session
    snapshot_id: str


@contextmanager
def exported_snapshot(url: str, cohorts: tuple[str, ...] | None) -> Iterator[Snapshot]:
    """A read-only REPEATABLE READ transaction on PostgreSQL whose snapshot is exported for the
    partition readers, held open for the block; for a run that reads ``cohorts``, the cohorts of
    users created since the last read are settled (and committed) first, as the in-process read does."""
    if is_sqlite_url(url):
        raise RuntimeError("partitioned reads need PostgreSQL; the embedded SQLite database has none")
    with session_scope(url) as session:
        settle_run_cohorts(session, cohorts)
    engine = create_engine(normalise_url(url), poolclass=NullPool)
    try:
        conn = engine.connect().execution_options(isolation_level="REPEATABLE READ")
        try:
            conn.begin()
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            snapshot_id = str(conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar_one())
            with Session(bind=conn) as session:
                yield Snapshot(session, snapshot_id)
        finally:
            # read only: nothing to keep, so a connection the database dropped meanwhile (an outage
            # after the reads) does not fail a run whose training went on without it
            with contextlib.suppress(SQLAlchemyError):
                conn.rollback()
            with contextlib.suppress(SQLAlchemyError):
                conn.close()
    finally:
        engine.dispose()


@dataclass(frozen=True)
class PostgresPartition:
    """Reads one partition's private training rows in the exported snapshot (run on a worker)."""

    url: str
    snapshot_id: str
    dataset_id: int
    cohorts: tuple[str, ...] | None
    partition: UserPartition
    excluded_users: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not _SNAPSHOT_ID.match(self.snapshot_id):
            raise ValueError("not an exported snapshot id")

    def __repr__(self) -> str:  # never the URL (its credentials) in a repr, a log or a traceback
        return "PostgresPartition(<a range of users>)"

    def __call__(self) -> Ratings:
        engine = create_engine(normalise_url(self.url), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                    conn.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{self.snapshot_id}'")
                    with Session(bind=conn) as session:
                        ds = session.get_one(Dataset, self.dataset_id)
                        return read_partition_rows(session, ds, self.cohorts, self.partition,
                                                   np.asarray(self.excluded_users, dtype=np.int64))
        finally:
            engine.dispose()


def user_ranges(session: Session, n_partitions: int) -> list[UserPartition]:
    """``n_partitions`` ranges of user row ids of equal width over the ids in the snapshot: every
    user in exactly one (the rows' partition never changes the model, so no balance is owed)."""
    low, high = session.execute(select(func.min(User.id), func.max(User.id))).one()
    return id_ranges(None if low is None else int(low), None if high is None else int(high), n_partitions)


def id_ranges(low: int | None, high: int | None, n_partitions: int) -> list[UserPartition]:
    """``n_partitions`` consecutive ranges of equal width (the last ones possibly empty) covering
    the ids ``low..high`` (None: no ids, every range empty)."""
    if n_partitions < 1:
        raise ValueError("n_partitions must be >= 1")
    if low is None or high is None:
        return [UserPartition(0, 0)] * n_partitions
    end = high + 1
    width = -(-(end - low) // n_partitions)  # ceiling
    return [UserPartition(min(low + p * width, end), min(low + (p + 1) * width, end)) for p in range(n_partitions)]


def partitioned_inputs(snapshot: Snapshot, url: str, ds: Dataset, algo: Algorithm[Any, Any], n_partitions: int,
                       cohorts: tuple[str, ...] | None) -> tuple[PartitionedRatings, dict[str, Any]]:
    """The training inputs of a distributable ``algo`` on ``ds`` as ``n_partitions`` readers, and
    the extra keyword arguments of its ``train`` (DP-CMF: the public inputs, read here in the
    snapshot: public, so the driver may hold them). Nothing private is read here."""
    if algo.data not in PARTITIONED_KINDS:
        raise ValueError(f"no partitioned read for data kind {algo.data!r}")
    if n_partitions < 1:
        raise ValueError("n_partitions must be >= 1")
    session = snapshot.session
    item_db, item_ext = item_index(session, ds)
    extra: dict[str, Any] = {}
    excluded = np.zeros(0, dtype=np.int64)
    if algo.data == "ratings+public":
        excluded, users = public_users_source(session, ds, item_db, item_ext)
        extra["public"] = public_data(session, ds, item_db, item_ext, users)
    readers = tuple(PostgresPartition(url, snapshot.snapshot_id, ds.id, cohorts, partition,
                                      tuple(int(u) for u in excluded))
                    for partition in user_ranges(session, n_partitions))
    return PartitionedRatings(item_ext, readers, frozenset(str(int(u)) for u in excluded)), extra
