"""The ratings-and-users store: the use cases' reads and writes of ``users`` and ``ratings``
(and the bulk read of any (user, item, value) table), PostgreSQL and SQLite.

:func:`app.db.stores.ratings_store` picks the implementation from the session's dialect
(:mod:`app.db.stores.ratings_postgres`, :mod:`app.db.stores.ratings_sqlite`). The ingest service
validates and decides; a store only reads and writes. The rules of one rating's write (what
makes it refused, what it creates) are the store's, in one statement on PostgreSQL (migration
0009) and in :meth:`RatingsStore.upsert_one` elsewhere; the contract tests run both on the same
cases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.dialect import rows_matched
from app.db.models import Item, Rating, User, Vote, bump_ratings_version_sharded
from app.db.stores.blocks import calendar, settle_cohorts
from app.db.stores.catalogue import DatasetRef, catalogue_store

__all__ = ["RatingsStore", "OneRating", "Triplets", "DatedTriplets", "TRIPLET_TABLES", "SqlRatings", "randomised_filter",
           "cohort_filter", "created_filter", "CreatedRanges", "UserPartition", "partition_filter"]

Triplets = tuple[np.ndarray, np.ndarray, np.ndarray]  # (user row id, item row id, value as float64)
# (user row id, item row id, value, created at as int64 microseconds since 1970-01-01 UTC)
DatedTriplets = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
CreatedRanges = Sequence[tuple[datetime | None, datetime]]  # [lo, hi) creation times (lo None: unbounded)
TRIPLET_TABLES = ("ratings", "votes")  # (user_id, item_id, value) tables


class UserPartition(NamedTuple):
    """The users whose row id lies in ``[first, end)``: one of a run's disjoint training partitions,
    which together hold every user (read by one cluster task each, issue 28). A range of the
    primary key's leading column, so a partition's query can read its own index range instead of
    scanning the table."""

    first: int
    end: int


class OneRating(NamedTuple):
    """What one rating's write found and did: the data set's range, the item's and the user's row
    ids (None: no such item; no user is created when nothing is written) and whether the rating
    was inserted (True), updated (False) or not written (None: unknown item or value outside
    the range)."""

    rating_min: float
    rating_max: float
    item_id: int | None
    user_id: int | None
    inserted: bool | None


class RatingsStore(Protocol):
    """Users and ratings of one session. Methods never commit; the caller's unit of work does."""

    def upsert_one(self, dataset: str, user_id: str, item_id: str, value: float, now: datetime) -> OneRating | None:
        """Write one rating where the data set and item exist and ``value`` lies in the data set's
        range (a new user created first); None: no such data set (nothing written)."""

    def start_rating_write(self, dataset: str) -> DatasetRef:
        """Begin a batch write: hold the references shared until the transaction ends (no user,
        item or data set a rating will reference is deleted meanwhile) and read the data set (404
        when unknown)."""

    def item_ids(self, ds: DatasetRef, external_ids: Sequence[str]) -> list[int | None]:
        """The row id of each of ``external_ids`` (None: no such item in ``ds``)."""

    def user_ids(self, external_ids: Sequence[str], now: datetime, check_rows: Callable[[], None]) -> list[int]:
        """The row id of each of ``external_ids``, missing users created. ``check_rows`` (raises
        when the batch is invalid) runs exactly once, before any user is kept."""

    def write_ratings(self, ds: DatasetRef, user_ids: list[int], item_ids: list[int], values: np.ndarray,
                      now: datetime, while_copying: Callable[[], None] | None = None) -> set[tuple[int, int]] | None:
        """Upsert the rows and bump the data set's version by their count; the (user, item) row-id
        pairs created, or None when every row was. ``while_copying`` (client work whose outcome
        does not depend on the write) may run while the database takes the rows in."""

    def ensure_users(self, external_ids: Sequence[str], now: datetime) -> dict[str, int]:
        """Create missing users; external id -> row id of each. PostgreSQL: the rows stay locked
        (FOR KEY SHARE) until the transaction ends."""

    def delete_rating(self, dataset_id: int, user_id: str, item_id: str) -> int:
        """Delete one rating (bumping the data set's version); the number deleted (0 or 1)."""

    def delete_user(self, user_id: str) -> int | None:
        """Delete a user and every rating of theirs (votes go by the foreign key's cascade),
        bumping each data set's version; the ratings removed, None when no such user."""

    def user_ratings(self, dataset_id: int, user_id: str) -> tuple[list[str], list[float]]:
        """The user's own ratings in the data set: (external item ids, values)."""

    def user_ratings_page(self, dataset_id: int, user_id: str, offset: int,
                          limit: int) -> tuple[int, list[tuple[str, float, datetime]]]:
        """(count, one page of (external item id, value, updated at) ordered by item id)."""

    def triplets(self, table: str, dataset_id: int, local_epsilon: float | None = None,
                 cohorts: Sequence[str] | None = None, public_too: bool = False,
                 partition: UserPartition | None = None) -> Triplets:
        """Every (user, item, value) row of ``table`` in the data set (votes with
        ``local_epsilon``: those randomised with exactly that ε0; with ``cohorts``: only rows of
        users in those cohorts, and with ``public_too`` those of users whose ratings are public;
        with ``partition``: only its users' rows; all filtered in the query)."""

    def dated_triplets(self, dataset_id: int, created_in: CreatedRanges, public_too: bool = False,
                       partition: UserPartition | None = None) -> DatedTriplets:
        """Every rating of the data set created in one of the ``[lo, hi)`` ranges ``created_in``
        (and with ``public_too`` every rating of users whose ratings are public), with its creation
        time; with ``partition`` only its users' (filtered in the query: no other rating is read)."""


def randomised_filter(local_epsilon: float | None) -> str:
    """SQL condition keeping only votes randomised with exactly ``local_epsilon`` (none: all rows)."""
    if local_epsilon is None:
        return ""
    value = float(local_epsilon)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("local_epsilon must be finite and > 0")
    return f" AND randomised AND local_epsilon = {value!r}"


_COHORT_LABEL = re.compile(r"^(legacy|\d{4}-\d{2}(-\d{2})?)$")


def cohort_filter(cohorts: Sequence[str] | None, public_of: int | None = None) -> str:
    """The SQL condition keeping only rows of users in ``cohorts`` (None: no filter; labels are
    checked against the calendar's label shapes before they enter the statement), and with
    ``public_of`` (a data set id) also the rows of users whose ratings of that data set are public."""
    if cohorts is None:
        return ""
    labels = sorted(set(cohorts))
    if not all(_COHORT_LABEL.match(label) for label in labels):
        raise ValueError("not a cohort label")
    quoted = ", ".join(f"'{label}'" for label in labels) or "NULL"
    members = f"user_id IN (SELECT id FROM users WHERE cohort IN ({quoted}))"
    if public_of is None:
        return f" AND {members}"
    return (f" AND ({members} OR user_id IN (SELECT user_id FROM public_rating_consents "
            f"WHERE dataset_id = {int(public_of)} AND public))")


def partition_filter(partition: UserPartition | None) -> str:
    """The SQL condition keeping only rows of ``partition``'s users (None: no filter)."""
    if partition is None:
        return ""
    first, end = int(partition.first), int(partition.end)
    if first > end:
        raise ValueError("a partition's range ends after it starts")
    return f" AND user_id >= {first} AND user_id < {end}"


def created_filter(created_in: CreatedRanges, literal: Callable[[datetime], str], public_of: int | None = None) -> str:
    """The SQL condition keeping only ratings created in one of the ranges (``literal``: the dialect's
    timestamp literal of a datetime the caller computed from calendar labels), and with ``public_of``
    also the ratings of users whose ratings of that data set are public."""
    parts = [" AND ".join(([f"created_at >= {literal(lo)}"] if lo is not None else []) + [f"created_at < {literal(hi)}"])
             for lo, hi in created_in]
    keep = " OR ".join(f"({p})" for p in parts) or "1 = 0"
    if public_of is not None:
        keep += (f" OR user_id IN (SELECT user_id FROM public_rating_consents WHERE dataset_id = {int(public_of)} "
                 "AND public)")
    return f" AND ({keep})"


class SqlRatings:
    """What both databases run alike (ORM statements); the subclasses add the dialect's own."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def _lock_user_rows(self, stmt: Any) -> Any:
        return stmt

    def _exclude_rating_writers(self) -> None:
        """Wait for every rating writer in flight; hold later ones off until commit."""

    def _user_row_id(self, user_id: str, *, lock: bool = False) -> int | None:
        stmt = select(User.id).where(User.external_id == user_id)
        return self.session.scalar(self._lock_user_rows(stmt) if lock else stmt)

    def delete_rating(self, dataset_id: int, user_id: str, item_id: str) -> int:
        # no references lock and no user row lock (LOCK ORDER in ratings_postgres): the rating row,
        # then the version shard
        uid = self._user_row_id(user_id)
        iid = catalogue_store(self.session).item_row_ids(dataset_id, [item_id]).get(item_id)
        if uid is None or iid is None:
            return 0
        n = rows_matched(self.session.execute(delete(Rating).where(
            Rating.dataset_id == dataset_id, Rating.user_id == uid, Rating.item_id == iid)))
        if n:
            bump_ratings_version_sharded(self.session, dataset_id, n=n)
        return n

    def delete_user(self, user_id: str) -> int | None:
        # the references first (every rating writer in flight commits before this reads and
        # deletes the user's ratings, a later one waits, then finds the user gone: no orphans);
        # then the user row locked: writers that lock it (votes, public data) likewise
        self._exclude_rating_writers()
        uid = self._user_row_id(user_id, lock=True)
        if uid is None:
            return None
        cal = calendar(self.session)
        if cal is not None:  # her cohort outlives her row (keyed by a hash of her external id)
            settle_cohorts(self.session, cal, [uid])
        per_ds = list(self.session.execute(
            select(Rating.dataset_id, func.count()).where(Rating.user_id == uid).group_by(Rating.dataset_id)).all())
        per_ds += self.session.execute(  # votes: removed by the cascade, counted for retraining
            select(Vote.dataset_id, func.count()).where(Vote.user_id == uid).group_by(Vote.dataset_id)).all()
        removed = rows_matched(self.session.execute(delete(Rating).where(Rating.user_id == uid)))
        self.session.execute(delete(User).where(User.id == uid))
        changed: dict[int, int] = {}
        for ds_id, count in per_ds:
            changed[int(ds_id)] = changed.get(int(ds_id), 0) + int(count)
        for ds_id in sorted(changed):  # the version shards last, in data-set order (LOCK ORDER)
            bump_ratings_version_sharded(self.session, ds_id, n=changed[ds_id])
        return int(removed)

    def user_ratings(self, dataset_id: int, user_id: str) -> tuple[list[str], list[float]]:
        rows = self.session.execute(
            select(Item.external_id, Rating.value)
            .join(Item, Item.id == Rating.item_id)
            .join(User, User.id == Rating.user_id)
            .where(Rating.dataset_id == dataset_id, User.external_id == user_id)
        ).all()
        return [r[0] for r in rows], [float(r[1]) for r in rows]

    def user_ratings_page(self, dataset_id: int, user_id: str, offset: int,
                          limit: int) -> tuple[int, list[tuple[str, float, datetime]]]:
        base = (select(Item.external_id, Rating.value, Rating.updated_at)
                .join(Item, Item.id == Rating.item_id).join(User, User.id == Rating.user_id)
                .where(Rating.dataset_id == dataset_id, User.external_id == user_id))
        total = self.session.scalar(select(func.count()).select_from(base.subquery())) or 0
        rows = self.session.execute(base.order_by(Item.external_id).offset(offset).limit(limit)).all()
        return int(total), [(e, float(v), t) for e, v, t in rows]

