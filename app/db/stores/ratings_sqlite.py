"""The ratings-and-users store on SQLite (the embedded, single-process deployment and the tests):
multi-row INSERT ... ON CONFLICT in chunks, no locks (SQLite serialises writers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import select

from app.db.dialect import CHUNK, chunks, driver_connection, insert_for
from app.db.models import Rating, User, bump_ratings_version_sharded
from app.db.stores.catalogue import DatasetRef, SqliteCatalogueStore
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

__all__ = ["SqliteRatingsStore"]


def _literal(moment: datetime) -> str:
    """A timestamp literal comparable with the stored text (naive UTC, microseconds, as SQLAlchemy writes it)."""
    return f"'{_naive_utc(moment).strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


class SqliteRatingsStore(SqlRatings):
    """Users and ratings on SQLite."""

    def upsert_one(self, dataset: str, user_id: str, item_id: str, value: float, now: datetime) -> OneRating | None:
        """The rules of :data:`app.db.stores.ratings_postgres._UPSERT_ONE` (migration 0009) in
        statements: nothing is written (no user created) for an unknown item or a value outside
        the data set's range [rating_min, rating_max]."""
        ds = SqliteCatalogueStore(self.session).find_dataset(dataset)
        if ds is None:
            return None
        ref = DatasetRef(ds.id, ds.name, ds.rating_min, ds.rating_max)
        iid = SqliteCatalogueStore(self.session).item_row_ids(ds.id, [item_id]).get(item_id)
        uid = self.session.scalar(select(User.id).where(User.external_id == user_id))
        if iid is None or not ref.rating_min <= value <= ref.rating_max:
            return OneRating(ref.rating_min, ref.rating_max, iid, uid, None)
        if uid is None:
            uid = self.ensure_users([user_id], now)[user_id]
        created = self.write_ratings(ref, [uid], [iid], np.array([value], dtype=np.float64), now)
        return OneRating(ref.rating_min, ref.rating_max, iid, uid, created is None or (uid, iid) in created)

    def start_rating_write(self, dataset: str) -> DatasetRef:
        """The data set alone: nothing to hold (SQLite has one writer at a time) and no id cache."""
        return SqliteCatalogueStore(self.session).dataset_ref(dataset)

    def item_ids(self, ds: DatasetRef, external_ids: Sequence[str]) -> list[int | None]:
        return list(map(SqliteCatalogueStore(self.session).item_row_ids(ds.id, external_ids).get, external_ids))

    def user_ids(self, external_ids: Sequence[str], now: datetime, check_rows: Callable[[], None]) -> list[int]:
        check_rows()
        return list(map(self.ensure_users(external_ids, now).__getitem__, external_ids))

    def ensure_users(self, external_ids: Sequence[str], now: datetime) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in chunks(sorted(set(external_ids)), CHUNK):
            stmt = insert_for(self.session, User.__table__).values(
                [{"external_id": e, "created_at": now, "updated_at": now} for e in part]
            ).on_conflict_do_nothing(index_elements=["external_id"])
            self.session.execute(stmt)
            rows = self.session.execute(select(User.id, User.external_id).where(User.external_id.in_(part)))
            out.update({ext: uid for uid, ext in rows})
        return out

    def write_ratings(self, ds: DatasetRef, user_ids: list[int], item_ids: list[int], values: np.ndarray,
                      now: datetime, while_copying: Callable[[], None] | None = None) -> set[tuple[int, int]] | None:
        """Multi-row upserts of :data:`~app.db.dialect.CHUNK` rows; a row whose ``created_at`` came
        back as ``now`` was created (each write has its own ``now``: the caller's clock)."""
        table = Rating.__table__
        created: set[tuple[int, int]] = set()
        now_key = _naive_utc(now)
        rows = [{"dataset_id": ds.id, "user_id": u, "item_id": i, "value": v, "created_at": now, "updated_at": now}
                for u, i, v in zip(user_ids, item_ids, values.tolist(), strict=True)]
        for part in chunks(rows, CHUNK):
            base = insert_for(self.session, table).values(list(part))
            stmt = base.on_conflict_do_update(
                index_elements=["user_id", "dataset_id", "item_id"],
                set_={"value": base.excluded.value, "updated_at": base.excluded.updated_at},
            ).returning(table.c.user_id, table.c.item_id, table.c.created_at)
            for uid, iid, created_at in self.session.execute(stmt):
                if _naive_utc(created_at) == now_key:
                    created.add((uid, iid))
        # the version counter last, as on PostgreSQL (LOCK ORDER in ratings_postgres); SQLite
        # serialises writers anyway
        bump_ratings_version_sharded(self.session, ds.id, n=len(user_ids))
        return created

    def triplets(self, table: str, dataset_id: int, local_epsilon: float | None = None,
                 cohorts: Sequence[str] | None = None, public_too: bool = False,
                 partition: UserPartition | None = None) -> Triplets:
        """``fetchmany`` chunks on the driver's cursor."""
        cursor = driver_connection(self.session).cursor()
        cursor.execute(f"SELECT user_id, item_id, value FROM {table} WHERE dataset_id = ?"
                       f"{randomised_filter(local_epsilon)}{cohort_filter(cohorts, int(dataset_id) if public_too else None)}"
                       f"{partition_filter(partition)}", (int(dataset_id),))
        parts = []
        while True:
            chunk = cursor.fetchmany(500_000)
            if not chunk:
                break
            parts.append(np.array(chunk, dtype=np.float64))
        cursor.close()
        arr = np.concatenate(parts) if parts else np.empty((0, 3))
        return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2]

    def dated_triplets(self, dataset_id: int, created_in: CreatedRanges, public_too: bool = False,
                       partition: UserPartition | None = None) -> DatedTriplets:
        cursor = driver_connection(self.session).cursor()
        cursor.execute("SELECT user_id, item_id, value, created_at FROM ratings WHERE dataset_id = ?"
                       + created_filter(created_in, _literal, int(dataset_id) if public_too else None)
                       + partition_filter(partition), (int(dataset_id),))
        rows = cursor.fetchall()
        cursor.close()
        if not rows:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)
        u, i, v, t = zip(*rows, strict=True)
        created = np.array([str(x) for x in t], dtype="datetime64[us]").astype(np.int64)
        return np.array(u, dtype=np.int64), np.array(i, dtype=np.int64), np.array(v, dtype=np.float64), created
