"""The ratings-and-users store on PostgreSQL: array parameters, binary COPY, pipelined round
trips, the per-process id cache (:mod:`app.db.reference_ids`) and the references lock.

Ratings take no row locks on the rows they reference (each was a WAL record, and a MultiXact
when two writers shared a row). Instead every rating write holds the *references lock* shared
(a transaction-scoped advisory lock, released at commit) from before it reads any user, item or
data set id until it commits, and :meth:`PostgresRatingsStore.delete_user` holds it exclusively
while it deletes the user and their ratings (no code deletes items or data sets; code that did
would take it exclusively too). So a delete either committed before the writer's next statement,
which then no longer sees the user (it is created again), or waits until the writer's ratings
are committed and deletes them: no orphan either way. Deletes are rare and short; while one
waits, new writers queue behind it (PostgreSQL grants lock requests in order).

LOCK ORDER, shared by batches, single writes, imports, rating and user deletes and the version
counters (so no two of them wait on each other in a cycle): (1) the references lock (shared by
writers, exclusive by a user delete); (2) user rows, in external-id order; (3) rating rows, in
(user, item) key order; (4) last, the data set's version shard rows (``ratings_version_shards``,
keyed by the backend pid, so two connections can share one), in data-set id order, each bumped
once after the rows it counts are written. The one-rating function of migration 0009 keeps the
same order. A rating delete takes only (3) and (4): it creates no reference and removes only its
own row (a user delete racing it deletes that row or finds it gone), so it neither takes the
references lock nor waits behind a user delete holding it. A transaction that PostgreSQL
nevertheless picks as a deadlock's victim (e.g. with a writer outside this store) is run again
whole by the ingest use cases (:func:`app.db.session.retry_lock_conflicts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import text

from app.db.dialect import driver_connection, driver_sql, pg_array
from app.db.models import RATINGS_VERSION_SHARDS, bump_ratings_version_sharded
from app.db.reference_ids import READ_EPOCH, ReferenceIds, reference_ids_at, remember_on_commit
from app.db.stores.catalogue import DatasetRef, PostgresCatalogueStore
from app.db.stores.postgres_copy import (
    PG_COPY_DATED,
    PG_COPY_HEADER,
    PG_COPY_TRIPLET,
    PG_EPOCH_US,
    pg_copy_ratings,
    pg_copy_triplets,
    pg_flushed_copy,
    pg_returning_unless_unique_violation,
    pg_unless_unique_violation,
)
from app.db.stores.ratings import (
    CreatedRanges,
    DatedTriplets,
    OneRating,
    SqlRatings,
    Triplets,
    UserPartition,
    cohort_filter,
    created_filter,
    partition_filter,
    randomised_filter,
)
from app.errors import UnknownDataset

__all__ = ["PostgresRatingsStore", "REFERENCES_LOCK_KEY", "PlainInsertFirst", "PLAIN_INSERT_FIRST", "NEW_USERS_FIRST",
           "UPSERTS_AFTER_A_MISS", "key_order"]

REFERENCES_LOCK_KEY = 0x70726976_72656301  # "privrec" + 1: the one advisory lock key of the service

# Users in two statements, both in sorted external-id order. The INSERT's DO UPDATE .. WHERE false
# locks every conflicting (existing) row without writing it, so concurrent writers lock users in one
# global order and a user deleted meanwhile is simply created again: no second INSERT, whose order
# could cross another writer's, is ever needed. (A single statement with DO NOTHING plus a
# FOR KEY SHARE select deadlocked in the delete/insert race test under load: DO NOTHING locks
# nothing, so a user deleted meanwhile needs a retry whose INSERT can cross another writer's.)
# The SELECT then holds every row FOR KEY SHARE until commit. Votes and public data use this
# (:meth:`PostgresRatingsStore.ensure_users`): the row locks serialise each user's writers (the
# votes cap checks).
_ENSURE_USERS = text(
    "INSERT INTO users (external_id, created_at, updated_at) "
    "SELECT e, :now, :now FROM unnest(CAST(:ids AS text[])) AS t(e) "
    "ON CONFLICT (external_id) DO UPDATE SET updated_at = EXCLUDED.updated_at WHERE false"
)
_USER_IDS = text(
    "SELECT u.id, u.external_id FROM unnest(CAST(:ids AS text[])) AS t(e) "
    "JOIN users u ON u.external_id = t.e ORDER BY u.id FOR KEY SHARE OF u"
)
_SHARE_REFERENCES = text("SELECT pg_advisory_xact_lock_shared(:key)")
_DATASET_REF = text("SELECT id, name, rating_min, rating_max FROM datasets WHERE name = :name")
_EXCLUSIVE_REFERENCES = text("SELECT pg_advisory_xact_lock(:key)")
# Under the shared references lock: the known users read, the others inserted (sorted), every id
# returned in one statement. The lookup reads the statement's snapshot, so a user committed by a
# concurrent writer after it began (DO NOTHING waited for that writer) is in neither half: the
# caller reads those again. Inserting only the unknown ids spares a conflict probe per known user.
# Each id is looked up by its own probe of the external-id index (a scalar subquery): a join
# left to the planner scanned and hashed the whole users table for a few hundred ids while the
# table's statistics were stale (a table that grew since the last ANALYZE).
_RATING_USERS = (
    "WITH t AS (SELECT e, (SELECT u.id FROM users u WHERE u.external_id = t.e) AS id "
    "FROM unnest(CAST(:ids AS text[])) AS t(e)), "
    "new AS (INSERT INTO users (external_id, created_at, updated_at) "
    "SELECT e, :now, :now FROM t WHERE id IS NULL ORDER BY e "
    "{on_conflict}RETURNING id, external_id) "
    "SELECT id, e FROM t WHERE id IS NOT NULL UNION ALL SELECT id, external_id FROM new"
)
_RATING_USERS_UPSERT = text(_RATING_USERS.format(on_conflict="ON CONFLICT (external_id) DO NOTHING "))
# Tried first, in a savepoint: the same without ON CONFLICT (no conflict probe, speculative
# insertion and confirmation record a new user). It fails only where a concurrent writer created
# one of the users after the lookup's snapshot (having waited for that writer to commit); then
# the savepoint is rolled back and _RATING_USERS_UPSERT runs.
_RATING_USERS_PLAIN = text(_RATING_USERS.format(on_conflict=""))
# Tried before that (also in a savepoint) unless a recent batch's uncached users existed: every
# uncached user inserted, no lookup at all (a batch's users not cached in this process are
# usually new). It fails on the first one that exists.
_NEW_USERS = text(
    "INSERT INTO users (external_id, created_at, updated_at) "
    "SELECT e, :now, :now FROM unnest(CAST(:ids AS text[])) AS t(e) ORDER BY e RETURNING id, external_id"
)
_RATING_USERS_AGAIN = text(
    "WITH t AS MATERIALIZED (SELECT e, (SELECT u.id FROM users u WHERE u.external_id = t.e) AS id "
    "FROM unnest(CAST(:ids AS text[])) AS t(e)) SELECT id, e FROM t WHERE id IS NOT NULL"
)
# The usual batch is all new ratings: COPY straight into ``ratings`` (PostgreSQL's bulk path: heap
# pages filled many rows at a time, one WAL record a page, and no executor per row) instead of the
# upsert (a conflict probe, a speculative insertion and its confirmation per row). It runs in a
# savepoint and fails at the first row whose (user, data set, item) exists (committed, or written
# by a concurrent writer that then commits): the savepoint is rolled back and the rows go through
# a temporary staging table and one set-based upsert (both in key order: no deadlock between
# writers). Either way the data set's version shard is bumped once by the batch's row count.
_BUMP_BATCH = text(
    "INSERT INTO ratings_version_shards (dataset_id, shard, n, changed_at) "
    f"VALUES (:ds, pg_backend_pid() % {RATINGS_VERSION_SHARDS}, :n, :now) "
    "ON CONFLICT (dataset_id, shard) DO UPDATE SET n = ratings_version_shards.n + EXCLUDED.n, "
    "changed_at = EXCLUDED.changed_at"
)
_COPY_RATINGS = "COPY ratings (dataset_id, user_id, item_id, value, created_at, updated_at) FROM STDIN (FORMAT BINARY)"
# the staging table, empty: emptied at every commit, and here for a second batch in one transaction
# (two statements in one round trip: no parameters)
_EMPTY_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS ingest_rating_stage "
    "(user_id bigint, item_id bigint, value float8) ON COMMIT DELETE ROWS; "
    "DELETE FROM ingest_rating_stage"
)
_COPY_STAGE = "COPY ingest_rating_stage (user_id, item_id, value) FROM STDIN (FORMAT BINARY)"
# the inserted (not updated) pairs come back as two arrays
_UPSERT_STAGED = text(
    "WITH upserted AS ("
    "INSERT INTO ratings (dataset_id, user_id, item_id, value, created_at, updated_at) "
    "SELECT :ds, user_id, item_id, value, :now, :now FROM ingest_rating_stage ORDER BY user_id, item_id "
    "ON CONFLICT (user_id, dataset_id, item_id) "
    "DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at "
    "RETURNING user_id, item_id, (xmax = 0) AS inserted) "
    "SELECT array_agg(user_id), array_agg(item_id) FROM upserted WHERE inserted"
)
_UPSERT_ARRAYS = text(
    "WITH upserted AS ("
    "INSERT INTO ratings (dataset_id, user_id, item_id, value, created_at, updated_at) "
    "SELECT :ds, u, i, v, :now, :now "
    "FROM unnest(CAST(:u AS bigint[]), CAST(:i AS bigint[]), CAST(:v AS float8[])) AS t(u, i, v) "
    "ON CONFLICT (user_id, dataset_id, item_id) "
    "DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at "
    "RETURNING user_id, item_id, (xmax = 0) AS inserted) "
    "SELECT user_id, item_id FROM upserted WHERE inserted"
)
# One rating in one call of a server-side function (migration 0009): the shared references lock,
# then the data set, item and user looked up (a VOLATILE PL/pgSQL function reads a fresh snapshot
# in each statement, so these see every delete committed before the lock was granted), then a new
# user's row, the rating and the data set's version shard written only if the data set and item
# exist and the value is in range. The row says what was found, so the caller can refuse (404/422,
# nothing written).
_UPSERT_ONE = text("SELECT * FROM upsert_one_rating(:name, :user, :item, :v, :now, :key, :shards)")
_STAGE_THRESHOLD = 64  # rows: below this one statement with array parameters beats COPY staging
UPSERTS_AFTER_A_MISS = 8  # staged batches that skip the plain insert (COPY) after one found a rating existing
_MAX_USER_ATTEMPTS = 5  # a concurrently deleted user is created again; this bounds the retries

_DRIVER_SHARE_REFERENCES = driver_sql(_SHARE_REFERENCES)
_DRIVER_DATASET_REF = driver_sql(_DATASET_REF)
_DRIVER_UPSERT_ONE = driver_sql(_UPSERT_ONE)
_DRIVER_RATING_USERS_UPSERT = driver_sql(_RATING_USERS_UPSERT)
_DRIVER_RATING_USERS_PLAIN = driver_sql(_RATING_USERS_PLAIN)
_DRIVER_NEW_USERS = driver_sql(_NEW_USERS)
_DRIVER_RATING_USERS_AGAIN = driver_sql(_RATING_USERS_AGAIN)
_DRIVER_BUMP_BATCH = driver_sql(_BUMP_BATCH)
_DRIVER_UPSERT_STAGED = driver_sql(_UPSERT_STAGED)


class PlainInsertFirst:
    """Whether a batch tries the plain insert (COPY into ``ratings``; its uncached users without a
    lookup) before the upsert. A batch with any existing row pays for a failed try; where one did,
    existing rows are likely in the batches that follow (a stream of re-ratings; users created by
    another process), so the next :data:`UPSERTS_AFTER_A_MISS` go straight to the upsert. Both
    ways write the same rows; this only picks the cheaper one."""

    def __init__(self) -> None:
        self._skips_left = 0

    def worth_trying(self) -> bool:
        if self._skips_left > 0:
            self._skips_left -= 1
            return False
        return True

    def missed(self) -> None:
        self._skips_left = UPSERTS_AFTER_A_MISS

    def reset(self) -> None:
        """Try the plain insert on the next batch again."""
        self._skips_left = 0


PLAIN_INSERT_FIRST = PlainInsertFirst()  # per process; a race between threads only shifts a count
NEW_USERS_FIRST = PlainInsertFirst()  # the same for a batch's uncached users (_NEW_USERS)


def key_order(u: np.ndarray, i: np.ndarray) -> np.ndarray:
    """The permutation that sorts rows by (user, item) row id: one sort of a combined 64-bit key
    where both ids fit in 31 bits (always, short of two billion users or items), else a lexsort."""
    if len(u) and min(u.min(), i.min()) >= 0 and max(u.max(), i.max()) < 2**31:
        return np.argsort((u << 32) | i)
    return np.lexsort((i, u))


def _cached_row_ids(cached: dict[str, int], external_ids: Sequence[str]) -> tuple[list[int | None], list[int]]:
    """Row id per element of ``external_ids`` from ``cached`` (``None`` where not cached), and the
    positions of those ``None``s. One C-level dict lookup per row: no per-row Python code when
    everything is cached (the usual batch)."""
    ids: list[int | None] = list(map(cached.get, external_ids))
    holes = [k for k, row_id in enumerate(ids) if row_id is None] if None in ids else []
    return ids, holes


def _fill_holes(ids: list[int | None], holes: list[int], external_ids: Sequence[str], read: dict[str, int]) -> None:
    """Fill ``ids`` at ``holes`` from ``read`` (by external id; ``None`` where it has none)."""
    for k in holes:
        ids[k] = read.get(external_ids[k])


def _nothing() -> None:
    """No work (a check already done)."""


class PostgresRatingsStore(SqlRatings):
    """Users and ratings on PostgreSQL. A batch write reads the id cache valid in its transaction
    (:meth:`start_rating_write`) and fills it when the transaction commits."""

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._refs: ReferenceIds | None = None

    def _lock_user_rows(self, stmt: Any) -> Any:
        return stmt.with_for_update()

    def _exclude_rating_writers(self) -> None:
        self.session.execute(_EXCLUSIVE_REFERENCES, {"key": REFERENCES_LOCK_KEY})

    def upsert_one(self, dataset: str, user_id: str, item_id: str, value: float, now: datetime) -> OneRating | None:
        """One statement (:data:`_UPSERT_ONE`) through the driver's cursor (prepared by psycopg
        after a few uses): no ORM objects, no SQL compilation."""
        params = {"name": dataset, "user": user_id, "item": item_id, "v": float(value), "now": now,
                  "key": REFERENCES_LOCK_KEY, "shards": RATINGS_VERSION_SHARDS}
        with driver_connection(self.session).cursor() as cursor:
            row = cursor.execute(_DRIVER_UPSERT_ONE, params).fetchone()
        return None if row is None else OneRating(*row)

    def start_rating_write(self, dataset: str) -> DatasetRef:
        """The references lock, the reference epoch and the data set in one round trip: a pipeline
        that the server runs in order, each read with its own snapshot taken after the lock was
        granted (so it sees every delete committed before)."""
        conn = driver_connection(self.session)
        with conn.cursor() as lock, conn.cursor() as epoch, conn.cursor() as found:
            with conn.pipeline():
                lock.execute(_DRIVER_SHARE_REFERENCES, {"key": REFERENCES_LOCK_KEY})
                epoch.execute(READ_EPOCH)
                found.execute(_DRIVER_DATASET_REF, {"name": dataset})
            epoch_row, ds_row = epoch.fetchone(), found.fetchone()
        if ds_row is None:
            raise UnknownDataset(dataset)
        self._refs = reference_ids_at(self.session, epoch_row)
        return DatasetRef(*ds_row)

    def _references(self) -> ReferenceIds:
        if self._refs is None:
            raise RuntimeError("start_rating_write first")
        return self._refs

    def item_ids(self, ds: DatasetRef, external_ids: Sequence[str]) -> list[int | None]:
        """Those in the id cache from there, the others read and added to it when the transaction
        commits."""
        refs = self._references()
        ids, holes = _cached_row_ids(refs.items_of(ds.id), external_ids)
        if holes:
            read = PostgresCatalogueStore(self.session).item_row_ids(ds.id, [external_ids[k] for k in holes])
            remember_on_commit(self.session, refs, dataset_id=ds.id, items=read)
            _fill_holes(ids, holes, external_ids, read)
        return ids

    def user_ids(self, external_ids: Sequence[str], now: datetime, check_rows: Callable[[], None]) -> list[int]:
        """Under the shared references lock: no user can be deleted meanwhile, so no row locks and
        no retry of the INSERT. Users in the id cache are not read again; the others are, and join
        it when the transaction commits. ``check_rows`` runs while PostgreSQL inserts the new
        users; where it raises, they are not inserted."""
        refs = self._references()
        ids, holes = _cached_row_ids(refs.users, external_ids)
        if not holes:
            check_rows()
        else:
            missing = sorted({external_ids[k] for k in holes})  # concurrent writers insert new users in one order
            with driver_connection(self.session).cursor() as cursor:  # plain tuples: no Row objects for 10,000 rows
                read = _read_or_create_users(cursor, missing, now, check_rows)
            if len(read) < len(missing):
                raise RuntimeError("users vanished under the references lock")  # pragma: no cover - impossible
            remember_on_commit(self.session, refs, users=read)
            _fill_holes(ids, holes, external_ids, read)
        return ids  # type: ignore[return-value]  # every hole filled

    def ensure_users(self, external_ids: Sequence[str], now: datetime) -> dict[str, int]:
        """One statement each, arrays as parameters; the rows stay locked until the transaction
        ends (the set-based replacement of the ratings' foreign key): a concurrent delete either
        finished before (the user is created again) or waits until this transaction commits."""
        ids = sorted(set(external_ids))
        out: dict[str, int] = {}
        missing = ids
        for _ in range(_MAX_USER_ATTEMPTS):
            self.session.execute(_ENSURE_USERS, {"ids": pg_array(missing), "now": now})
            out.update({ext: uid for uid, ext in self.session.execute(_USER_IDS, {"ids": pg_array(missing)}).all()})
            missing = [e for e in ids if e not in out]
            if not missing:
                return out
        raise RuntimeError("users were deleted concurrently again and again; retry the request")

    def write_ratings(self, ds: DatasetRef, user_ids: list[int], item_ids: list[int], values: np.ndarray,
                      now: datetime, while_copying: Callable[[], None] | None = None) -> set[tuple[int, int]] | None:
        """COPY the rows into ``ratings`` (:data:`_COPY_RATINGS`), or where a rating exists already,
        into a temporary staging table and one set-based upsert (a small batch: one statement
        with array parameters). The ratings table has no foreign keys; the caller holds the
        references lock shared, so the data set, users and items stay. ``while_copying`` runs once
        the COPY's rows are sent, while PostgreSQL inserts them."""
        u, i = np.array(user_ids, dtype=np.int64), np.array(item_ids, dtype=np.int64)
        order = key_order(u, i)  # key order: B-tree inserts touch neighbouring pages
        u, i, v = u[order], i[order], values[order]
        if len(order) < _STAGE_THRESHOLD:
            result = self.session.execute(_UPSERT_ARRAYS, {
                "ds": ds.id, "now": now, "u": pg_array(u.tolist()), "i": pg_array(i.tolist()),
                "v": pg_array(v.tolist())})
            created = set(map(tuple, result.all()))
            bump_ratings_version_sharded(self.session, ds.id, n=len(order))  # the shard last (LOCK ORDER)
            return created
        params = {"ds": ds.id, "now": now, "n": len(order)}
        with driver_connection(self.session).cursor() as cursor:
            def copy_new() -> None:
                # flushed: every row is with the server before while_copying takes the client's time
                with pg_flushed_copy(cursor, _COPY_RATINGS) as copy:
                    copy.write(pg_copy_ratings(ds.id, u, i, v, now))
                    if while_copying is not None:
                        while_copying()

            if PLAIN_INSERT_FIRST.worth_trying():
                if pg_unless_unique_violation(cursor, copy_new):
                    cursor.execute(_DRIVER_BUMP_BATCH, params)  # the version shard last (LOCK ORDER)
                    return None  # every row was new
                PLAIN_INSERT_FIRST.missed()
            cursor.execute(_EMPTY_STAGE)
            with cursor.copy(_COPY_STAGE) as copy:
                copy.write(pg_copy_triplets(u, i, v))
            row = cursor.execute(_DRIVER_UPSERT_STAGED, params).fetchone()
            cursor.execute(_DRIVER_BUMP_BATCH, params)  # the version shard last (LOCK ORDER)
        created_users, created_items = row if row is not None else (None, None)
        return set(zip(created_users or [], created_items or [], strict=True))

    def triplets(self, table: str, dataset_id: int, local_epsilon: float | None = None,
                 cohorts: Sequence[str] | None = None, public_too: bool = False,
                 partition: UserPartition | None = None) -> Triplets:
        """Binary COPY (fixed-width columns, no NULLs)."""
        sql = (f"COPY (SELECT user_id, item_id, CAST(value AS DOUBLE PRECISION) FROM {table} "
               f"WHERE dataset_id = {int(dataset_id)}" + randomised_filter(local_epsilon)
               + cohort_filter(cohorts, int(dataset_id) if public_too else None) + partition_filter(partition)
               + ") TO STDOUT (FORMAT BINARY)")
        rows = self._copy_rows(sql, PG_COPY_TRIPLET)  # no parameters: psycopg sends the text as it is
        return rows["u"].astype(np.int64), rows["i"].astype(np.int64), rows["v"].astype(np.float64)

    def dated_triplets(self, dataset_id: int, created_in: CreatedRanges, public_too: bool = False,
                       partition: UserPartition | None = None) -> DatedTriplets:
        """Binary COPY with the creation time as a fourth fixed-width column."""
        sql = ("COPY (SELECT user_id, item_id, CAST(value AS DOUBLE PRECISION), created_at FROM ratings "
               f"WHERE dataset_id = {int(dataset_id)}"
               + created_filter(created_in, _literal, int(dataset_id) if public_too else None)
               + partition_filter(partition) + ") TO STDOUT (FORMAT BINARY)")
        rows = self._copy_rows(sql, PG_COPY_DATED)
        return (rows["u"].astype(np.int64), rows["i"].astype(np.int64), rows["v"].astype(np.float64),
                rows["t"].astype(np.int64) + PG_EPOCH_US)

    def _copy_rows(self, sql: str, dtype: np.dtype) -> np.ndarray:
        """The rows of a binary ``COPY ... TO STDOUT`` of fixed-width 8-byte columns, as ``dtype``."""
        cursor = driver_connection(self.session).cursor()
        buf = bytearray()
        with cursor.copy(sql) as copy:
            for chunk in copy:
                buf += chunk
        cursor.close()
        body = memoryview(buf)[len(PG_COPY_HEADER) : len(buf) - 2]  # strip the header and the -1 trailer
        if len(body) % dtype.itemsize:
            raise RuntimeError("unexpected binary COPY layout for ratings")
        rows = np.frombuffer(body, dtype=dtype)
        widths = [name for name in dtype.names or () if name.startswith("l")]
        fixed_width = np.all(rows["n"] == len(widths)) and all(np.all(rows[name] == 8) for name in widths)
        if len(rows) and not fixed_width:
            raise RuntimeError("unexpected binary COPY layout for ratings")
        return rows


def _literal(moment: datetime) -> str:
    """A timestamptz literal of ``moment`` (timezone-aware; computed from calendar labels, never from input)."""
    return f"TIMESTAMPTZ '{moment.isoformat(sep=' ')}'"


def _read_or_create_users(cursor: Any, missing: list[str], now: datetime,
                          check_rows: Callable[[], None]) -> dict[str, int]:
    """External id -> row id of each of ``missing`` (sorted), the unknown ones inserted, in a
    savepoint: all of them (:data:`_NEW_USERS`), or where one existed, those a lookup does not
    find (:data:`_RATING_USERS_PLAIN`); where a concurrent writer created one of them meanwhile,
    by :data:`_RATING_USERS_UPSERT` and a second read. ``check_rows`` runs while the first try runs."""
    params = {"ids": pg_array(missing), "now": now}
    if NEW_USERS_FIRST.worth_trying():
        rows = pg_returning_unless_unique_violation(cursor, _DRIVER_NEW_USERS, params, check_rows)
        check_rows = _nothing
        if rows is not None:
            return {ext: uid for uid, ext in rows}
        NEW_USERS_FIRST.missed()
    rows = pg_returning_unless_unique_violation(cursor, _DRIVER_RATING_USERS_PLAIN, params, check_rows)
    if rows is not None:
        return {ext: uid for uid, ext in rows}
    read = {ext: uid for uid, ext in cursor.execute(_DRIVER_RATING_USERS_UPSERT, params).fetchall()}
    if len(read) < len(missing):  # created by a concurrent writer that committed while this statement ran
        again = pg_array([e for e in missing if e not in read])
        read.update({ext: uid for uid, ext in cursor.execute(_DRIVER_RATING_USERS_AGAIN, {"ids": again}).fetchall()})
    return read
