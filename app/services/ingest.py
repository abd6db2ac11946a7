"""Ingest: ratings (single, batch, bulk import, delete) and users (delete).

Every write is idempotent (upserts keyed by data set, user and item) and bumps the data set's
``ratings_version`` in the same transaction. Functions never commit; the caller does. Invalid
input raises an :class:`~app.errors.PrivrecError` before anything is written. Rating values are
never logged. This module validates and decides; the ratings store
(:mod:`app.db.stores.ratings`) reads and writes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy.orm import Session

from app.db.models import utcnow
from app.db.session import retry_lock_conflicts
from app.db.stores import DatasetRef, RatingsStore, catalogue_store, ratings_store
from app.errors import InvalidRows, RatingOutOfRange, UnknownDataset, UnknownItem, UnknownItems, UnknownRating, UnknownUser
from app.schemas.common import Page
from app.schemas.ingest import RatingBatchResult, RatingColumns, RatingOut, RatingRow, RatingWriteOut, RowResult, RowResultDict

__all__ = [
    "upsert_rating",
    "upsert_ratings_batch",
    "import_ratings",
    "delete_rating",
    "delete_user",
    "list_user_ratings",
    "user_ratings_arrays",
    "ensure_user_rows",
]

WriteStatus = Literal["created", "updated"]  # what one rating write did


def _check_range(ds: Any, value: float) -> str | None:
    if not math.isfinite(value):
        return "rating must be a finite number"
    if not (ds.rating_min <= value <= ds.rating_max):
        return f"rating {value!r} is outside the data set's range [{ds.rating_min}, {ds.rating_max}]"
    return None


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


def _upsert_many(store: RatingsStore, ds: DatasetRef, users: Sequence[str], items: Sequence[str],
                 values: Sequence[float], item_map: dict[str, int] | None = None,
                 while_copying: Callable[[], None] | None = None) -> tuple[list[WriteStatus], int, int]:
    """Validate then upsert parallel rows (after ``store.start_rating_write``); return (status per
    row, created, updated). ``while_copying``: see :meth:`RatingsStore.write_ratings`.

    Raises 422 with per-row errors (and writes nothing) if any row is invalid.
    """
    vals = np.asarray(values, dtype=np.float64)
    iids = store.item_ids(ds, items) if item_map is None else list(map(item_map.get, items))

    def check_rows() -> None:
        errors = _row_errors(ds, users, items, vals, iids)
        if errors:
            raise InvalidRows(
                f"{len(errors)} of {len(users)} rows are invalid; nothing was written",
                details={"rows": [e.model_dump() for e in errors[:1000]], "n_invalid": len(errors)},
            )

    now = utcnow()
    # the rows are checked while the store inserts the batch's new users (undone if one is invalid)
    uids = store.user_ids(users, now, check_rows)
    created = store.write_ratings(ds, uids, iids, vals, now, while_copying)  # type: ignore[arg-type]  # no None left
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


def upsert_rating(session: Session, *, dataset: str, user_id: str, item_id: str, rating: float) -> RatingWriteOut:
    """Insert or update one rating (404 unknown data set or item, 422 out of range). The store
    writes only a valid rating (:meth:`RatingsStore.upsert_one`); what it found says which
    refusal, if any, applies.

    Run again, whole, when PostgreSQL picks it as a deadlock's victim (:func:`retry_lock_conflicts`)."""
    return retry_lock_conflicts(session, lambda: _upsert_rating(
        session, dataset=dataset, user_id=user_id, item_id=item_id, rating=rating))


def _upsert_rating(session: Session, *, dataset: str, user_id: str, item_id: str,
                  rating: float) -> RatingWriteOut:
    """One run of :func:`upsert_rating`."""
    outcome = ratings_store(session).upsert_one(dataset, user_id, item_id, float(rating), utcnow())
    if outcome is None:
        raise UnknownDataset(dataset)
    _require_in_range(outcome, rating)
    if outcome.item_id is None:
        raise _unknown_item(dataset, item_id)
    if outcome.inserted is None:
        raise RuntimeError("the rating was not written")  # pragma: no cover - a valid rating is always written
    status: WriteStatus = "created" if outcome.inserted else "updated"
    return RatingWriteOut(user_id=user_id, item_id=item_id, rating=rating, status=status,
                          updated_at=utcnow())


def upsert_ratings_batch(session: Session, *, dataset: str, rows: Sequence[RatingRow]) -> RatingBatchResult:
    """Upsert a batch all-or-nothing; per-row results (422 with per-row errors if any is invalid).

    Run again, whole, when PostgreSQL picks it as a deadlock's victim (:func:`retry_lock_conflicts`)."""
    return retry_lock_conflicts(session, lambda: _upsert_ratings_batch(
        session, dataset=dataset, rows=rows))


def _upsert_ratings_batch(session: Session, *, dataset: str, rows: Sequence[RatingRow]) -> RatingBatchResult:
    """One run of :func:`upsert_ratings_batch`."""
    store = ratings_store(session)
    ds = store.start_rating_write(dataset)
    if isinstance(rows, RatingColumns):  # validated column-wise by the route's body model
        users, items, values = rows.user_ids, rows.item_ids, rows.ratings
    else:
        users, items, values = [r.user_id for r in rows], [r.item_id for r in rows], [r.rating for r in rows]
    all_created: list[list[RowResultDict]] = []  # built while PostgreSQL inserts the rows (the COPY)

    def build_all_created() -> None:
        all_created.append(_row_results(users, items, ["created"] * len(users)))

    status, n_created, n_updated = _upsert_many(store, ds, users, items, values, while_copying=build_all_created)
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
    store = ratings_store(session)
    ds = store.start_rating_write(dataset)
    last: dict[tuple[str, str], float] = {}
    for u, i, v in rows:
        last[(str(u), str(i))] = float(v)
    users = [k[0] for k in last]
    items = [k[1] for k in last]
    item_map = catalogue_store(session).item_row_ids(ds.id, items)
    missing = sorted(set(items) - set(item_map))
    if missing:
        shown = ", ".join(repr(m) for m in missing[:20]) + (", ..." if len(missing) > 20 else "")
        raise UnknownItems(
            f"{len(missing)} unknown item(s) in data set {ds.name!r}: {shown}. Items come only from public input: "
            "add them first (privrec import-items, or PUT /v1/datasets/{dataset}/items/{item_id}); nothing was written",
            details={"unknown_items": missing[:1000], "n_unknown": len(missing)})
    _upsert_many(store, ds, users, items, list(last.values()), item_map)
    return len(last)


def delete_rating(session: Session, *, dataset: str, user_id: str, item_id: str) -> int:
    """Delete one rating (404 when it does not exist).

    Run again, whole, when PostgreSQL picks it as a deadlock's victim (:func:`retry_lock_conflicts`)."""
    return retry_lock_conflicts(session, lambda: _delete_rating(
        session, dataset=dataset, user_id=user_id, item_id=item_id))


def _delete_rating(session: Session, *, dataset: str, user_id: str, item_id: str) -> int:
    """One run of :func:`delete_rating`."""
    ds = catalogue_store(session).get_dataset(dataset)
    n = ratings_store(session).delete_rating(ds.id, user_id, item_id)
    if n == 0:
        raise UnknownRating("no such rating", details={"user_id": user_id, "item_id": item_id})
    return n


def delete_user(session: Session, *, user_id: str) -> int:
    """Delete a user and every rating of theirs in every data set; return the ratings removed.
    Their votes go with the user row (foreign-key cascade); their randomised-vote allowance stays
    (keyed by a hash of the data set and external id), so re-creating the user gives no fresh bits.

    Run again, whole, when PostgreSQL picks it as a deadlock's victim (:func:`retry_lock_conflicts`)."""
    return retry_lock_conflicts(session, lambda: _delete_user(
        session, user_id=user_id))


def _delete_user(session: Session, *, user_id: str) -> int:
    """One run of :func:`delete_user`."""
    removed = ratings_store(session).delete_user(user_id)
    if removed is None:
        raise UnknownUser(f"unknown user {user_id!r}", details={"user_id": user_id})
    return removed


def user_ratings_arrays(session: Session, *, dataset_id: int, user_id: str) -> tuple[list[str], list[float]]:
    """The one user's own ratings in a data set: (external item ids, values). Privileged."""
    return ratings_store(session).user_ratings(dataset_id, user_id)


def list_user_ratings(session: Session, *, dataset: str, user_id: str, offset: int, limit: int) -> Page[RatingOut]:
    """One page of a user's own ratings, ordered by item id."""
    ds = catalogue_store(session).get_dataset(dataset)
    total, rows = ratings_store(session).user_ratings_page(ds.id, user_id, offset, limit)
    items = [RatingOut(user_id=user_id, item_id=e, rating=v, updated_at=t) for e, v, t in rows]
    return Page[RatingOut].build(items, total=total, offset=offset, limit=limit)


def ensure_user_rows(session: Session, external_ids: Sequence[str], now: datetime) -> dict[str, int]:
    """Create missing users; external id -> row id (shared with the votes and public-data
    services: users are created on their first write; PostgreSQL: the rows stay locked until the
    transaction ends)."""
    return ratings_store(session).ensure_users(external_ids, now)
