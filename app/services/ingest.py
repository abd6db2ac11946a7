"""Ingest: ratings (single, batch, bulk import, delete) and users (delete).

Every write is idempotent (upserts keyed by data set, user and item) and bumps the data set's
``ratings_version`` in the same transaction. Functions never commit; the caller does. Invalid
input raises an :class:`~app.errors.PrivrecError` before anything is written. Rating values are
never logged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import numpy as np
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from app.db.dialect import (
    CHUNK,
    chunks,
    driver_connection,
    driver_sql,
    insert_for,
    pg_array,
    pg_copy_ratings,
    pg_copy_triplets,
    pg_flushed_copy,
    pg_returning_unless_unique_violation,
    pg_unless_unique_violation,
    rows_matched,
)
from app.db.models import RATINGS_VERSION_SHARDS, Item, Rating, User, Vote, bump_ratings_version_sharded, utcnow
from app.db.reference_ids import READ_EPOCH, ReferenceIds, reference_ids_at, remember_on_commit
from app.db.session import is_postgres
from app.errors import InvalidRows, RatingOutOfRange, UnknownItem, UnknownItems, UnknownRating, UnknownUser
from app.schemas.common import Page
from app.schemas.ingest import RatingBatchResult, RatingColumns, RatingOut, RatingRow, RatingWriteOut, RowResult, RowResultDict
from app.services.catalog import DatasetRef, dataset_ref, get_dataset, item_row_ids, unknown_dataset

__all__ = [
    "upsert_rating",
    "upsert_ratings_batch",
    "import_ratings",
    "delete_rating",
    "delete_user",
    "list_user_ratings",
    "user_ratings_arrays",
    "ensure_user_rows",
    "share_references",
    "REFERENCES_LOCK_KEY",
]

WriteStatus = Literal["created", "updated"]  # what one rating write did


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def _check_range(ds: Any, value: float) -> str | None:
    if not math.isfinite(value):
        return "rating must be a finite number"
    if not (ds.rating_min <= value <= ds.rating_max):
        return f"rating {value!r} is outside the data set's range [{ds.rating_min}, {ds.rating_max}]"
    return None


# Users in two statements, both in sorted external-id order. The INSERT's DO UPDATE .. WHERE false
# locks every conflicting (existing) row without writing it, so concurrent writers lock users in one
# global order and a user deleted meanwhile is simply created again: no second INSERT, whose order
# could cross another writer's, is ever needed. (A single statement with DO NOTHING plus a
# FOR KEY SHARE select deadlocked in the delete/insert race test under load: DO NOTHING locks
# nothing, so a user deleted meanwhile needs a retry whose INSERT can cross another writer's.)
# The SELECT then holds every row FOR KEY SHARE until commit. Votes and public data use this
# (:func:`ensure_user_rows`): the row locks serialise each user's writers (the votes cap checks).
_PG_ENSURE_USERS = text(
    "INSERT INTO users (external_id, created_at, updated_at) "
    "SELECT e, :now, :now FROM unnest(CAST(:ids AS text[])) AS t(e) "
    "ON CONFLICT (external_id) DO UPDATE SET updated_at = EXCLUDED.updated_at WHERE false"
)
_PG_USER_IDS = text(
    "SELECT u.id, u.external_id FROM unnest(CAST(:ids AS text[])) AS t(e) "
    "JOIN users u ON u.external_id = t.e ORDER BY u.id FOR KEY SHARE OF u"
)
# Ratings take no row locks on the rows they reference (each was a WAL record, and a MultiXact
# when two writers shared a row). Instead every rating write holds the *references lock* shared
# (a transaction-scoped advisory lock, released at commit) from before it reads any user, item or
# data set id until it commits, and :func:`delete_user` holds it exclusively while it deletes the
# user and their ratings (no code deletes items or data sets; code that did would take it
# exclusively too). So a delete either committed before the writer's next statement, which then
# no longer sees the user (it is created again), or waits until the writer's ratings are
# committed and deletes them: no orphan either way. Deletes are rare and short; while one waits,
# new writers queue behind it (PostgreSQL grants lock requests in order).
REFERENCES_LOCK_KEY = 0x70726976_72656301  # "privrec" + 1: the one advisory lock key of the service
_PG_SHARE_REFERENCES = text("SELECT pg_advisory_xact_lock_shared(:key)")
_PG_DATASET_REF = text("SELECT id, name, rating_min, rating_max FROM datasets WHERE name = :name")
_PG_EXCLUSIVE_REFERENCES = text("SELECT pg_advisory_xact_lock(:key)")
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
_PG_RATING_USERS = text(_RATING_USERS.format(on_conflict="ON CONFLICT (external_id) DO NOTHING "))
# Tried first, in a savepoint: the same without ON CONFLICT (no conflict probe, speculative
# insertion and confirmation record a new user). It fails only where a concurrent writer created
# one of the users after the lookup's snapshot (having waited for that writer to commit); then
# the savepoint is rolled back and _PG_RATING_USERS runs.
_PG_RATING_USERS_PLAIN = text(_RATING_USERS.format(on_conflict=""))
# Tried before that (also in a savepoint) unless a recent batch's uncached users existed: every
# uncached user inserted, no lookup at all (a batch's users not cached in this process are
# usually new). It fails on the first one that exists.
_PG_NEW_USERS = text(
    "INSERT INTO users (external_id, created_at, updated_at) "
    "SELECT e, :now, :now FROM unnest(CAST(:ids AS text[])) AS t(e) ORDER BY e RETURNING id, external_id"
)
_PG_RATING_USERS_AGAIN = text(
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
_PG_BUMP_BATCH = text(
    "INSERT INTO ratings_version_shards (dataset_id, shard, n, changed_at) "
    f"VALUES (:ds, pg_backend_pid() % {RATINGS_VERSION_SHARDS}, :n, :now) "
    "ON CONFLICT (dataset_id, shard) DO UPDATE SET n = ratings_version_shards.n + EXCLUDED.n, "
    "changed_at = EXCLUDED.changed_at"
)
_PG_COPY_RATINGS = "COPY ratings (dataset_id, user_id, item_id, value, created_at, updated_at) FROM STDIN (FORMAT BINARY)"
# the staging table, empty: emptied at every commit, and here for a second batch in one transaction
# (two statements in one round trip: no parameters)
_PG_EMPTY_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS ingest_rating_stage "
    "(user_id bigint, item_id bigint, value float8) ON COMMIT DELETE ROWS; "
    "DELETE FROM ingest_rating_stage"
)
# the inserted (not updated) pairs come back as two arrays
_PG_UPSERT_STAGED = text(
    "WITH upserted AS ("
    "INSERT INTO ratings (dataset_id, user_id, item_id, value, created_at, updated_at) "
    "SELECT :ds, user_id, item_id, value, :now, :now FROM ingest_rating_stage ORDER BY user_id, item_id "
    "ON CONFLICT (user_id, dataset_id, item_id) "
    "DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at "
    "RETURNING user_id, item_id, (xmax = 0) AS inserted) "
    "SELECT array_agg(user_id), array_agg(item_id) FROM upserted WHERE inserted"
)
_PG_UPSERT_ARRAYS = text(
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
_PG_UPSERT_ONE = text("SELECT * FROM upsert_one_rating(:name, :user, :item, :v, :now, :key, :shards)")
_STAGE_THRESHOLD = 64  # rows: below this one statement with array parameters beats COPY staging
_UPSERTS_AFTER_A_MISS = 8  # staged batches that skip the plain insert (COPY) after one found a rating existing
_MAX_USER_ATTEMPTS = 5  # a concurrently deleted user is created again; this bounds the retries


_DRIVER_SHARE_REFERENCES = driver_sql(_PG_SHARE_REFERENCES)
_DRIVER_DATASET_REF = driver_sql(_PG_DATASET_REF)
_DRIVER_UPSERT_ONE = driver_sql(_PG_UPSERT_ONE)
_DRIVER_RATING_USERS = driver_sql(_PG_RATING_USERS)
_DRIVER_RATING_USERS_PLAIN = driver_sql(_PG_RATING_USERS_PLAIN)
_DRIVER_NEW_USERS = driver_sql(_PG_NEW_USERS)
_DRIVER_RATING_USERS_AGAIN = driver_sql(_PG_RATING_USERS_AGAIN)
_DRIVER_BUMP_BATCH = driver_sql(_PG_BUMP_BATCH)
_DRIVER_UPSERT_STAGED = driver_sql(_PG_UPSERT_STAGED)


class _PlainInsertFirst:
    """Whether a batch tries the plain insert (COPY into ``ratings``; its uncached users without a
    lookup) before the upsert. A batch with any existing row pays for a failed try; where one did,
    existing rows are likely in the batches that follow (a stream of re-ratings; users created by
    another process), so the next :data:`_UPSERTS_AFTER_A_MISS` go straight to the upsert. Both
    ways write the same rows; this only picks the cheaper one."""

    def __init__(self) -> None:
        self._skips_left = 0

    def worth_trying(self) -> bool:
        if self._skips_left > 0:
            self._skips_left -= 1
            return False
        return True

    def missed(self) -> None:
        self._skips_left = _UPSERTS_AFTER_A_MISS


_PLAIN_INSERT_FIRST = _PlainInsertFirst()  # per process; a race between threads only shifts a count
_NEW_USERS_FIRST = _PlainInsertFirst()  # the same for a batch's uncached users (_PG_NEW_USERS)


class _Range(NamedTuple):
    """A data set's rating range (what :func:`_check_range` reads)."""

    rating_min: float
    rating_max: float


def _ensure_users(session: Session, external_ids: Sequence[str], now: datetime) -> dict[str, int]:
    """Create missing users; return external id -> row id for all of ``external_ids``.

    PostgreSQL: the rows are locked until the transaction ends (the set-based replacement of the
    ratings' foreign key): a concurrent ``delete_user`` either finished before (the user is
    created again) or waits until this transaction has committed its ratings.
    """
    ids = sorted(set(external_ids))
    out: dict[str, int] = {}
    if is_postgres(session):  # one statement each, arrays as parameters (PostgreSQL)
        missing = ids
        for _ in range(_MAX_USER_ATTEMPTS):
            session.execute(_PG_ENSURE_USERS, {"ids": pg_array(missing), "now": now})
            out.update({ext: uid for uid, ext in session.execute(_PG_USER_IDS, {"ids": pg_array(missing)}).all()})
            missing = [e for e in ids if e not in out]
            if not missing:
                return out
        raise RuntimeError("users were deleted concurrently again and again; retry the request")
    for part in chunks(ids, CHUNK):
        stmt = insert_for(session, User.__table__).values(
            [{"external_id": e, "created_at": now, "updated_at": now} for e in part]
        ).on_conflict_do_nothing(index_elements=["external_id"])
        session.execute(stmt)
        rows = session.execute(select(User.id, User.external_id).where(User.external_id.in_(part)))
        out.update({ext: uid for uid, ext in rows})
    return out


def share_references(session: Session) -> None:
    """PostgreSQL: hold the references lock shared until the transaction ends (a no-op when this
    transaction holds it already counts twice; SQLite serialises writers). Call before reading
    any user, item or data set id that a rating will reference."""
    if is_postgres(session):
        session.execute(_PG_SHARE_REFERENCES, {"key": REFERENCES_LOCK_KEY})


def _start_rating_write(session: Session, dataset: str) -> tuple[DatasetRef, ReferenceIds | None]:
    """Take the references lock shared (:func:`share_references`), then read the reference epoch
    and the data set (404 when unknown). PostgreSQL: the three statements in one round trip, a
    pipeline that the server runs in order, each read with its own snapshot taken after the lock
    was granted (so it sees every delete committed before). SQLite: the data set alone (no id cache)."""
    if not is_postgres(session):
        return dataset_ref(session, dataset), None
    conn = driver_connection(session)
    with conn.cursor() as lock, conn.cursor() as epoch, conn.cursor() as found:
        with conn.pipeline():
            lock.execute(_DRIVER_SHARE_REFERENCES, {"key": REFERENCES_LOCK_KEY})
            epoch.execute(READ_EPOCH)
            found.execute(_DRIVER_DATASET_REF, {"name": dataset})
        epoch_row, ds_row = epoch.fetchone(), found.fetchone()
    if ds_row is None:
        raise unknown_dataset(dataset)
    return DatasetRef(*ds_row), reference_ids_at(session, epoch_row)


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


def _rating_user_ids(session: Session, refs: ReferenceIds, external_ids: Sequence[str],
                     now: datetime, check_rows: Callable[[], None]) -> list[int]:
    """Create missing users; return the row id of each of ``external_ids`` (PostgreSQL, under the
    shared references lock: no user can be deleted meanwhile, so no row locks and no retry of the
    INSERT). Users in ``refs`` are not read again; the others are, and join it when the
    transaction commits. ``check_rows`` (raises where a row is invalid) runs once, while
    PostgreSQL inserts the new users; where it raises, they are not inserted."""
    ids, holes = _cached_row_ids(refs.users, external_ids)
    if not holes:
        check_rows()
    else:
        missing = sorted({external_ids[k] for k in holes})  # concurrent writers insert new users in one order
        with driver_connection(session).cursor() as cursor:  # plain tuples: no Row objects for 10,000 rows
            read = _read_or_create_users(cursor, missing, now, check_rows)
        if len(read) < len(missing):
            raise RuntimeError("users vanished under the references lock")  # pragma: no cover - impossible
        remember_on_commit(session, refs, users=read)
        _fill_holes(ids, holes, external_ids, read)
    return ids  # type: ignore[return-value]  # every hole filled


def _read_or_create_users(cursor: Any, missing: list[str], now: datetime,
                          check_rows: Callable[[], None]) -> dict[str, int]:
    """External id -> row id of each of ``missing`` (sorted), the unknown ones inserted, in a
    savepoint: all of them (:data:`_PG_NEW_USERS`), or where one existed, those a lookup does not
    find (:data:`_PG_RATING_USERS_PLAIN`); where a concurrent writer created one of them meanwhile,
    by :data:`_PG_RATING_USERS` and a second read. ``check_rows`` runs while the first try runs."""
    params = {"ids": pg_array(missing), "now": now}
    if _NEW_USERS_FIRST.worth_trying():
        rows = pg_returning_unless_unique_violation(cursor, _DRIVER_NEW_USERS, params, check_rows)
        check_rows = _nothing
        if rows is not None:
            return {ext: uid for uid, ext in rows}
        _NEW_USERS_FIRST.missed()
    rows = pg_returning_unless_unique_violation(cursor, _DRIVER_RATING_USERS_PLAIN, params, check_rows)
    if rows is not None:
        return {ext: uid for uid, ext in rows}
    read = {ext: uid for uid, ext in cursor.execute(_DRIVER_RATING_USERS, params).fetchall()}
    if len(read) < len(missing):  # created by a concurrent writer that committed while this statement ran
        again = pg_array([e for e in missing if e not in read])
        read.update({ext: uid for uid, ext in cursor.execute(_DRIVER_RATING_USERS_AGAIN, {"ids": again}).fetchall()})
    return read


def _nothing() -> None:
    """No work (a check already done)."""


def _rating_item_ids(session: Session, refs: ReferenceIds | None, ds: DatasetRef,
                     external_ids: Sequence[str]) -> list[int | None]:
    """The row id of each of ``external_ids`` (``None``: no such item in ``ds``): those in ``refs``
    from there, the others read (:func:`item_row_ids`) and added to it when the transaction commits."""
    if refs is None:
        return list(map(item_row_ids(session, ds, external_ids).get, external_ids))
    ids, holes = _cached_row_ids(refs.items_of(ds.id), external_ids)
    if holes:
        read = item_row_ids(session, ds, [external_ids[k] for k in holes])
        remember_on_commit(session, refs, dataset_id=ds.id, items=read)
        _fill_holes(ids, holes, external_ids, read)
    return ids


def _write_ratings(session: Session, ds: DatasetRef, user_ids: list[int], item_ids: list[int],
                   values: np.ndarray, now: datetime,
                   while_copying: Callable[[], None] | None = None) -> set[tuple[int, int]] | None:
    """Upsert (INSERT ... ON CONFLICT DO UPDATE) and bump the data set's version by the row count;
    return the (user, item) row-id pairs that were created, or ``None`` when every row was.
    ``while_copying``: see :func:`_write_ratings_pg`."""
    if is_postgres(session):
        return _write_ratings_pg(session, ds, user_ids, item_ids, values, now, while_copying)
    bump_ratings_version_sharded(session, ds.id, n=len(user_ids))
    table = Rating.__table__
    created: set[tuple[int, int]] = set()
    now_key = _naive_utc(now)
    rows = [{"dataset_id": ds.id, "user_id": u, "item_id": i, "value": v, "created_at": now, "updated_at": now}
            for u, i, v in zip(user_ids, item_ids, values.tolist(), strict=True)]
    for part in chunks(rows, CHUNK):
        base = insert_for(session, table).values(list(part))
        stmt = base.on_conflict_do_update(
            index_elements=["user_id", "dataset_id", "item_id"],
            set_={"value": base.excluded.value, "updated_at": base.excluded.updated_at},
        ).returning(table.c.user_id, table.c.item_id, table.c.created_at)
        for uid, iid, created_at in session.execute(stmt):
            if _naive_utc(created_at) == now_key:
                created.add((uid, iid))
    return created


def _key_order(u: np.ndarray, i: np.ndarray) -> np.ndarray:
    """The permutation that sorts rows by (user, item) row id: one sort of a combined 64-bit key
    where both ids fit in 31 bits (always, short of two billion users or items), else a lexsort."""
    if len(u) and min(u.min(), i.min()) >= 0 and max(u.max(), i.max()) < 2**31:
        return np.argsort((u << 32) | i)
    return np.lexsort((i, u))


def _write_ratings_pg(session: Session, ds: DatasetRef, user_ids: list[int], item_ids: list[int],
                      values: np.ndarray, now: datetime,
                      while_copying: Callable[[], None] | None = None) -> set[tuple[int, int]] | None:
    """PostgreSQL's bulk path: COPY the rows into ``ratings`` (:data:`_PG_COPY_RATINGS`), or where
    a rating exists already, into a temporary staging table and one set-based upsert.
    The ratings table has no foreign keys; the caller holds the references lock shared
    (:func:`share_references`), so the data set, users and items stay. ``while_copying`` runs
    once the COPY's rows are sent, while PostgreSQL inserts them (client work in parallel with
    the server's; its outcome must not depend on whether the COPY succeeds)."""
    u, i = np.array(user_ids, dtype=np.int64), np.array(item_ids, dtype=np.int64)
    order = _key_order(u, i)  # key order: B-tree inserts touch neighbouring pages
    u, i, v = u[order], i[order], values[order]
    if len(order) < _STAGE_THRESHOLD:
        result = session.execute(_PG_UPSERT_ARRAYS, {
            "ds": ds.id, "now": now, "u": pg_array(u.tolist()), "i": pg_array(i.tolist()),
            "v": pg_array(v.tolist())})
        bump_ratings_version_sharded(session, ds.id, n=len(order))
        return set(map(tuple, result.all()))
    params = {"ds": ds.id, "now": now, "n": len(order)}
    with driver_connection(session).cursor() as cursor:
        cursor.execute(_DRIVER_BUMP_BATCH, params)

        def copy_new() -> None:
            # flushed: every row is with the server before while_copying takes the client's time
            with pg_flushed_copy(cursor, _PG_COPY_RATINGS) as copy:
                copy.write(pg_copy_ratings(ds.id, u, i, v, now))
                if while_copying is not None:
                    while_copying()

        if _PLAIN_INSERT_FIRST.worth_trying():
            if pg_unless_unique_violation(cursor, copy_new):
                return None  # every row was new
            _PLAIN_INSERT_FIRST.missed()
        cursor.execute(_PG_EMPTY_STAGE)
        with cursor.copy("COPY ingest_rating_stage (user_id, item_id, value) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(pg_copy_triplets(u, i, v))
        row = cursor.execute(_DRIVER_UPSERT_STAGED, params).fetchone()
    created_users, created_items = row if row is not None else (None, None)
    return set(zip(created_users or [], created_items or [], strict=True))


_MIX = np.int64(-0x61C8864680B583EB)  # 2^64 / golden ratio, as int64: spreads item row ids over 64 bits


def _pairs_distinct(users: Sequence[str], item_ids: list[int]) -> bool:
    """True when no (user, item row id) pair repeats, by one sort of a 64-bit key a row (the user's
    string hash mixed with the item's row id) instead of a set of 10,000 tuples. A repeated key (a
    repeated pair, or by chance two pairs sharing a key) gives False: the caller checks row by row."""
    keys = np.fromiter(map(hash, users), dtype=np.int64, count=len(users))
    keys ^= np.asarray(item_ids, dtype=np.int64) * _MIX  # wraps modulo 2^64
    keys.sort()
    return not bool((keys[1:] == keys[:-1]).any())


def _row_errors(ds: DatasetRef, users: Sequence[str], items: Sequence[str], values: np.ndarray,
                item_ids: list[int | None]) -> list[RowResult]:
    """Every invalid row: non-finite or out-of-range value, unknown item (row id ``None``), repeated pair."""
    bad_value = ~np.isfinite(values) | (values < ds.rating_min) | (values > ds.rating_max)
    # the usual batch, checked set-wise first: no value out of range, no unknown item, no repeated pair
    if not bad_value.any() and None not in item_ids and _pairs_distinct(users, item_ids):  # type: ignore[arg-type]
        return []
    errors: list[RowResult] = []
    seen: dict[tuple[str, str], int] = {}
    for k, (u, i) in enumerate(zip(users, items, strict=True)):
        first = seen.setdefault((u, i), k)
        if bad_value[k]:
            msg = _check_range(ds, float(values[k]))
        elif item_ids[k] is None:
            msg = f"unknown item {i!r} in data set {ds.name!r}"
        elif first != k:
            msg = f"duplicate (user, item) pair; first at row {first}"
        else:
            continue
        errors.append(RowResult(index=k, user_id=u, item_id=i, status="error", error=msg))
    return errors


def _upsert_many(session: Session, ds: DatasetRef, refs: ReferenceIds | None, users: Sequence[str],
                 items: Sequence[str], values: Sequence[float], item_map: dict[str, int] | None = None,
                 while_copying: Callable[[], None] | None = None) -> tuple[list[WriteStatus], int, int]:
    """Validate then upsert parallel rows; return (status per row, created, updated). ``refs``:
    the cached ids (:func:`_start_rating_write`; ``None`` on SQLite); ``while_copying``: see
    :func:`_write_ratings_pg`.

    Raises 422 with per-row errors (and writes nothing) if any row is invalid.
    """
    vals = np.asarray(values, dtype=np.float64)
    iids = _rating_item_ids(session, refs, ds, items) if item_map is None else list(map(item_map.get, items))

    def check_rows() -> None:
        errors = _row_errors(ds, users, items, vals, iids)
        if errors:
            raise InvalidRows(
                f"{len(errors)} of {len(users)} rows are invalid; nothing was written",
                details={"rows": [e.model_dump() for e in errors[:1000]], "n_invalid": len(errors)},
            )

    now = utcnow()
    if refs is None:
        check_rows()
        uids = list(map(_ensure_users(session, users, now).__getitem__, users))
    else:  # PostgreSQL: the rows are checked while it inserts the batch's new users (undone if one is invalid)
        uids = _rating_user_ids(session, refs, users, now, check_rows)
    created = _write_ratings(session, ds, uids, iids, vals, now, while_copying)  # type: ignore[arg-type]  # no None left
    if created is None:
        return ["created"] * len(uids), len(uids), 0
    status: list[WriteStatus] = ["created" if pair in created else "updated" for pair in zip(uids, iids, strict=True)]
    n_created = len(created)
    return status, n_created, len(status) - n_created


def _unknown_item(dataset: str, item_id: str) -> UnknownItem:
    return UnknownItem(f"unknown item {item_id!r} in data set {dataset!r}",
                       details={"item_id": item_id})


def _require_in_range(ds: Any, rating: float) -> None:
    msg = _check_range(ds, rating)
    if msg is not None:
        raise RatingOutOfRange(msg,
                               details={"rating": rating, "range": [ds.rating_min, ds.rating_max]})


def _upsert_one_pg(session: Session, dataset: str, user_id: str, item_id: str, rating: float) -> WriteStatus:
    """One rating on PostgreSQL in one statement (:data:`_PG_UPSERT_ONE`): the shared references
    lock, the lookups, a new user's row, the upsert and the version bump. Through the driver's
    cursor (prepared by psycopg after a few uses): no ORM objects, no SQL compilation."""
    params = {"name": dataset, "user": user_id, "item": item_id, "v": float(rating), "now": utcnow(),
              "key": REFERENCES_LOCK_KEY, "shards": RATINGS_VERSION_SHARDS}
    with driver_connection(session).cursor() as cursor:
        row = cursor.execute(_DRIVER_UPSERT_ONE, params).fetchone()
    if row is None:
        raise unknown_dataset(dataset)
    rating_min, rating_max, iid, _uid, inserted = row
    _require_in_range(_Range(rating_min, rating_max), rating)
    if iid is None:
        raise _unknown_item(dataset, item_id)
    if inserted is None:
        raise RuntimeError("the rating was not written")  # pragma: no cover - impossible under the lock
    return "created" if inserted else "updated"


def upsert_rating(session: Session, *, dataset: str, user_id: str, item_id: str,
                  rating: float) -> RatingWriteOut:
    """Insert or update one rating (404 unknown data set or item, 422 out of range)."""
    if is_postgres(session):
        status = _upsert_one_pg(session, dataset, user_id, item_id, rating)
    else:
        ds = dataset_ref(session, dataset)
        _require_in_range(ds, rating)
        item_map = item_row_ids(session, ds, [item_id])
        if item_id not in item_map:
            raise _unknown_item(dataset, item_id)
        status = _upsert_many(session, ds, None, [user_id], [item_id], [rating], item_map)[0][0]
    return RatingWriteOut(user_id=user_id, item_id=item_id, rating=rating, status=status,
                          updated_at=utcnow())


def upsert_ratings_batch(session: Session, *, dataset: str, rows: Sequence[RatingRow]) -> RatingBatchResult:
    """Upsert a batch all-or-nothing; per-row results (422 with per-row errors if any is invalid)."""
    ds, refs = _start_rating_write(session, dataset)
    if isinstance(rows, RatingColumns):  # validated column-wise by the route's body model
        users, items, values = rows.user_ids, rows.item_ids, rows.ratings
    else:
        users, items, values = [r.user_id for r in rows], [r.item_id for r in rows], [r.rating for r in rows]
    all_created: list[list[RowResultDict]] = []  # built while PostgreSQL inserts the rows (the COPY)

    def build_all_created() -> None:
        all_created.append(_row_results(users, items, ["created"] * len(users)))

    status, n_created, n_updated = _upsert_many(session, ds, refs, users, items, values,
                                                while_copying=build_all_created)
    # every row created (whichever way it was written): the results built during the COPY hold
    results = all_created[0] if all_created and n_updated == 0 else _row_results(users, items, status)
    return RatingBatchResult(created=n_created, updated=n_updated, results=results)


def _row_results(users: Sequence[str], items: Sequence[str], status: Sequence[WriteStatus]) -> list[RowResultDict]:
    """The per-row results: typed by construction, no per-row validation (it cost ~5 us a row),
    serialised as plain dicts."""
    return [{"index": k, "user_id": u, "item_id": i, "status": s, "error": None}
            for k, (u, i, s) in enumerate(zip(users, items, status, strict=True))]


def import_ratings(session: Session, *, dataset: str, rows: Sequence[tuple[str, str, float]]) -> int:
    """Bulk import (CLI, benchmarks): upsert ``(user, item, rating)`` tuples; return the row count.

    A later duplicate of a (user, item) pair in ``rows`` wins. Items come only from public input
    (the items API, :func:`import_items`): a row naming an unknown item is refused (422
    ``unknown_items``, listing them; nothing written), never a reason to create the item, which
    would make the public catalogue reveal that someone rated it.
    """
    ds, refs = _start_rating_write(session, dataset)
    last: dict[tuple[str, str], float] = {}
    for u, i, v in rows:
        last[(str(u), str(i))] = float(v)
    users = [k[0] for k in last]
    items = [k[1] for k in last]
    item_map = item_row_ids(session, ds, items)
    missing = sorted(set(items) - set(item_map))
    if missing:
        shown = ", ".join(repr(m) for m in missing[:20]) + (", ..." if len(missing) > 20 else "")
        raise UnknownItems(
            f"{len(missing)} unknown item(s) in data set {ds.name!r}: {shown}. Items come only from public input: "
            "add them first (privrec import-items, or PUT /v1/datasets/{dataset}/items/{item_id}); nothing was written",
            details={"unknown_items": missing[:1000], "n_unknown": len(missing)})
    _upsert_many(session, ds, refs, users, items, list(last.values()), item_map)
    return len(last)


def _user_row_id(session: Session, user_id: str, *, lock: bool = False) -> int | None:
    stmt = select(User.id).where(User.external_id == user_id)
    return session.scalar(stmt.with_for_update() if lock and is_postgres(session) else stmt)


def delete_rating(session: Session, *, dataset: str, user_id: str, item_id: str) -> int:
    """Delete one rating (404 when it does not exist)."""
    ds = get_dataset(session, dataset)
    uid = _user_row_id(session, user_id)
    iid = item_row_ids(session, ds, [item_id]).get(item_id)
    n = 0
    if uid is not None and iid is not None:
        n = rows_matched(session.execute(delete(Rating).where(
            Rating.dataset_id == ds.id, Rating.user_id == uid, Rating.item_id == iid)))
    if n == 0:
        raise UnknownRating("no such rating", details={"user_id": user_id, "item_id": item_id})
    bump_ratings_version_sharded(session, ds.id, n=1)
    return n


def delete_user(session: Session, *, user_id: str) -> int:
    """Delete a user and every rating of theirs in every data set; return the ratings removed.
    The ratings are deleted here (the table has no foreign keys); their votes go with the user row
    (foreign-key cascade); their randomised-vote allowance stays
    (keyed by a hash of the data set and external id), so re-creating the user gives no fresh bits."""
    # the references lock exclusively first: every rating writer in flight commits before this
    # reads and deletes the user's ratings, a later one waits, then finds the user gone (no
    # orphans); then FOR UPDATE: writers that lock the user row (votes, public data) likewise
    if is_postgres(session):
        session.execute(_PG_EXCLUSIVE_REFERENCES, {"key": REFERENCES_LOCK_KEY})
    uid = _user_row_id(session, user_id, lock=True)
    if uid is None:
        raise UnknownUser(f"unknown user {user_id!r}", details={"user_id": user_id})
    per_ds = list(session.execute(
        select(Rating.dataset_id, func.count()).where(Rating.user_id == uid).group_by(Rating.dataset_id)
    ).all())
    per_ds += session.execute(  # votes: removed by the cascade, counted for retraining
        select(Vote.dataset_id, func.count()).where(Vote.user_id == uid).group_by(Vote.dataset_id)
    ).all()
    removed = rows_matched(session.execute(delete(Rating).where(Rating.user_id == uid)))
    session.execute(delete(User).where(User.id == uid))
    for ds_id, count in per_ds:
        bump_ratings_version_sharded(session, ds_id, n=int(count))
    return int(removed)


def user_ratings_arrays(session: Session, *, dataset_id: int, user_id: str) -> tuple[list[str], list[float]]:
    """The one user's own ratings in a data set: (external item ids, values). Privileged."""
    rows = session.execute(
        select(Item.external_id, Rating.value)
        .join(Item, Item.id == Rating.item_id)
        .join(User, User.id == Rating.user_id)
        .where(Rating.dataset_id == dataset_id, User.external_id == user_id)
    ).all()
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def list_user_ratings(session: Session, *, dataset: str, user_id: str, offset: int, limit: int) -> Page[RatingOut]:
    """One page of a user's own ratings, ordered by item id."""
    ds = get_dataset(session, dataset)
    base = (select(Item.external_id, Rating.value, Rating.updated_at)
            .join(Item, Item.id == Rating.item_id).join(User, User.id == Rating.user_id)
            .where(Rating.dataset_id == ds.id, User.external_id == user_id))
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    rows = session.execute(base.order_by(Item.external_id).offset(offset).limit(limit)).all()
    items = [RatingOut(user_id=user_id, item_id=e, rating=float(v), updated_at=t) for e, v, t in rows]
    return Page[RatingOut].build(items, total=int(total), offset=offset, limit=limit)


# Shared with other services (votes, public data): users are created on their first write.
ensure_user_rows = _ensure_users
