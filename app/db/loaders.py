"""Training loaders: what an algorithm trains on, read from the database in one transaction.

One loader per data kind an :class:`app.core.algorithms.Algorithm` declares (its ``data``):

* ``"ratings"``: the data set's ratings as a :class:`Ratings` (items = every item of the data set);
* ``"ratings+public"`` (DP-CMF): the private ratings without public users' rows, plus the public
  inputs (item metadata tokens, public similarities, public users' ratings) as ``public=``;
* ``"votes"`` (one-bit mechanisms): the thumbs up/down votes as a :class:`Ratings` of ±1.

Each loader returns ``(data, extra keyword arguments for Algorithm.train)``. Services pick the
loader from the algorithm's declared kind (:func:`load_training_inputs`), never from its name.

A run reads only the privacy blocks its reservation charged (``cohorts``, chosen by
:func:`app.ledger.select_cohorts` before any private read): every query below filters on the
users' cohort, so ratings of any other block are never loaded.

A ``user_period`` data set (:data:`app.core.privacy.blocks.USER_PERIOD`) keys its blocks by the
period of each rating's creation instead: the query keeps the ratings created in the chosen periods,
and each (user, period) becomes its own training row (:func:`unit_ratings`), so every per-user step
of training (centring offset, sample or weights, contribution bound, clip, solve) is per unit and
removing one unit changes one row of one block. The rows are labelled ``"<user id>@<period>"``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp
from sqlalchemy.orm import Session

from app.core.algorithms import Algorithm, DataKind
from app.core.data.item_tokens import MIN_TOKEN_ITEMS, item_tokens
from app.core.data.ratings import Ratings
from app.core.mf.dpcmf import PublicData, PublicSource, metadata_source, similarity_source, split_public_users
from app.core.privacy.blocks import USER_PERIOD, period_ranges
from app.db.models import BlockCalendar, Dataset
from app.db.stores import blocks as block_store
from app.db.stores import public_inputs, ratings_store
from app.db.stores.ratings import UserPartition
from app.services.bulk_read import item_index, ratings_from_triplets

__all__ = ["LOADERS", "load_ratings_and_public", "load_ratings_only", "load_training_inputs", "load_votes", "unit_ratings",
           "public_data", "public_users_source", "read_partition_rows", "settle_run_cohorts"]

Cohorts = Sequence[str] | None
Loader = Callable[[Session, Dataset, Cohorts], tuple[Ratings, dict[str, Any]]]


def _triplets(session: Session, ds: Dataset, table: str, cohorts: Cohorts, local_epsilon: float | None = None,
              public_too: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``table`` in ``ds`` of users in ``cohorts`` (None: every user; ``public_too``: and
    of the users whose ratings are public, whatever their cohort), after settling the cohort of
    every user created since the last read (a function of her own creation only)."""
    if cohorts is not None:
        cal = block_store.calendar(session)
        if cal is not None:
            block_store.settle_cohorts(session, cal)
    return ratings_store(session).triplets(table, ds.id, local_epsilon, cohorts, public_too)


def _period_keys(created_us: np.ndarray, cal: BlockCalendar) -> np.ndarray:
    """The calendar period of each creation time (µs since 1970 UTC) as an integer (months or days
    since 1970); creations before the calendar's first period count in that period."""
    first = np.array(cal.start, dtype=_period_dtype(cal)).astype(np.int64)
    return np.maximum(created_us.astype("datetime64[us]").astype(_period_dtype(cal)).astype(np.int64), first)


def _period_dtype(cal: BlockCalendar) -> str:
    return "datetime64[M]" if cal.period == "month" else "datetime64[D]"


def unit_ratings(item_db: np.ndarray, item_ext: np.ndarray, u: np.ndarray, i: np.ndarray, v: np.ndarray,
                 created_us: np.ndarray, cal: BlockCalendar) -> Ratings:
    """A :class:`Ratings` with one row per (user, period of creation): the training rows of a
    ``user_period`` data set, labelled ``"<user id>@<period>"``, sorted by user then period."""
    periods = _period_keys(created_us, cal)
    base = int(periods.min()) if len(periods) else 0
    offset = periods - base
    if len(offset) and (int(offset.max()) >= 1 << 20 or int(u.max()) >= 1 << 42):
        raise RuntimeError("user or period ids out of the unit key's range")
    keys, rows = np.unique((u << 20) | offset, return_inverse=True)
    names = ((keys & ((1 << 20) - 1)) + base).astype(_period_dtype(cal)).astype(str)  # the calendar's labels
    labels = np.array([f"{user}@{name}" for user, name in zip((keys >> 20).tolist(), names.tolist(), strict=True)],
                      dtype=object)
    by_row = ratings_from_triplets(item_db, item_ext, rows.astype(np.int64), i, v)  # rows 0..n-1, all present
    return replace(by_row, user_ids=labels, _user_pos={})


def _dated(session: Session, ds: Dataset, cohorts: Cohorts, public_too: bool = False,
           partition: UserPartition | None = None) -> tuple[BlockCalendar, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(the calendar, the ratings of a ``user_period`` data set created in the periods ``cohorts``
    with their creation times; with ``public_too`` also every rating of users whose ratings are
    public; with ``partition`` only its users')."""
    cal = block_store.calendar(session)
    if cal is None or cohorts is None:
        raise RuntimeError("a user_period run reads the periods its reservation chose from the calendar")
    ranges = period_ranges(list(cohorts), cal.start, cal.period)
    return cal, ratings_store(session).dated_triplets(ds.id, ranges, public_too, partition)


def load_ratings_only(session: Session, ds: Dataset, cohorts: Cohorts = None) -> tuple[Ratings, dict[str, Any]]:
    """Every rating of ``ds`` by a user in ``cohorts`` (``user_period``: created in the periods
    ``cohorts``, one row per (user, period)); items = the whole catalogue; no extra inputs."""
    if ds.privacy_unit == USER_PERIOD:
        cal, dated = _dated(session, ds, cohorts)
        return unit_ratings(*item_index(session, ds), *dated, cal), {}
    return ratings_from_triplets(*item_index(session, ds), *_triplets(session, ds, "ratings", cohorts)), {}


def load_votes(session: Session, ds: Dataset, cohorts: Cohorts = None, *,
               local_epsilon: float | None = None) -> tuple[Ratings, dict[str, Any]]:
    """Every stored bit of ``ds`` by a user in ``cohorts`` as a :class:`Ratings` of ±1 (items = the
    whole catalogue); with ``local_epsilon`` only the bits randomised at ingestion with exactly that ε0.
    Votes have no ``user_period`` unit (a training request refuses it before any reservation)."""
    if ds.privacy_unit == USER_PERIOD:
        raise RuntimeError("votes are accounted per user: a user_period data set trains on none")
    triplets = _triplets(session, ds, "votes", cohorts, local_epsilon)
    return ratings_from_triplets(*item_index(session, ds), *triplets), {}


def _metadata(session: Session, ds: Dataset, item_db: np.ndarray) -> PublicSource:
    by_id = {i: item_tokens(c, f) for i, c, f in public_inputs.item_metadata(session, ds.id)}
    return metadata_source([by_id.get(i, ()) for i in item_db.tolist()], min_items=MIN_TOKEN_ITEMS)


def _similarity_block(item_pos: np.ndarray, neighbour_pos: np.ndarray, scores: np.ndarray,
                      n_items: int) -> sp.csr_matrix:
    """One source's neighbour lists as S rows, each row also holding its own item.

    Row j lists j's neighbours with their scores and j itself with the row's largest |score|
    (an item is at least as similar to itself as to its nearest neighbour): without that entry
    the row would fit w_f to the neighbours only and never reach v_j, so an item with no
    private ratings would get nothing from its own list (stored lists never hold self pairs).
    """
    owners = np.unique(item_pos)
    top = np.zeros(n_items)
    np.maximum.at(top, item_pos, np.abs(scores))
    block = similarity_source(np.concatenate([item_pos, owners]), np.concatenate([neighbour_pos, owners]),
                              np.concatenate([scores, top[owners]]), n_items)
    return block.matrix


def _similarities(session: Session, ds: Dataset, item_db: np.ndarray, item_ext: np.ndarray) -> PublicSource | None:
    """Every declared-public source's lists stacked (one row per (source, item)); None when empty."""
    grouped: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    for name, item, neighbour, score in public_inputs.public_similarities(session, ds.id):
        grouped[name].append((item, neighbour, score))
    blocks, labels = [], []
    for name in sorted(grouped):
        arr = np.array(grouped[name], dtype=np.float64)
        i, k = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
        pos_i, pos_k = np.searchsorted(item_db, i), np.searchsorted(item_db, k)
        if np.any(pos_i >= len(item_db)) or np.any(pos_k >= len(item_db)) \
                or not (np.array_equal(item_db[pos_i], i) and np.array_equal(item_db[pos_k], k)):
            raise RuntimeError("similarities reference items outside their data set")
        blocks.append(_similarity_block(pos_i, pos_k, arr[:, 2], len(item_db)))
        labels += [f"{name}:{e}" for e in item_ext[np.unique(pos_i)].tolist()]
    if not blocks:
        return None
    return PublicSource("similarities", sp.vstack(blocks, format="csr"), tuple(labels))


def _split_public_users(session: Session, ds: Dataset, ratings: Ratings) -> tuple[Ratings, PublicSource | None]:
    """(private ratings without public users' rows, their rows as the public_users source or None)."""
    public_ids = np.intersect1d(public_inputs.public_user_ids(session, ds.id),
                                np.asarray(ratings.user_ids, dtype=np.int64))
    if len(public_ids) == 0:
        return ratings, None
    return split_public_users(ratings, public_ids)


def _split_public_units(session: Session, ds: Dataset, cohorts: Cohorts, item_db: np.ndarray,
                        item_ext: np.ndarray) -> tuple[Ratings, PublicSource | None]:
    """``user_period``: (the private ratings of the periods ``cohorts``, one row per (user, period), the
    public users' ratings of every period as one row per user, or None)."""
    cal, (u, i, v, created) = _dated(session, ds, cohorts, public_too=True)
    public_ids = np.intersect1d(public_inputs.public_user_ids(session, ds.id), u)
    public = np.isin(u, public_ids)
    private = unit_ratings(item_db, item_ext, u[~public], i[~public], v[~public], created[~public], cal)
    if len(public_ids) == 0:
        return private, None
    return private, split_public_users(ratings_from_triplets(item_db, item_ext, u[public], i[public], v[public]),
                                       public_ids)[1]


def load_ratings_and_public(session: Session, ds: Dataset, cohorts: Cohorts = None) -> tuple[Ratings, dict[str, Any]]:
    """DP-CMF's inputs: (private ratings, {"public": PublicData}).

    The private ratings leave out every public user's rows (their users too), so no private
    statistic contains them; items are every item of ``ds`` in :func:`item_index` order and the
    public sources' columns follow it. Sources with no entries are left out.
    """
    item_db, item_ext = item_index(session, ds)
    if ds.privacy_unit == USER_PERIOD:
        private, users = _split_public_units(session, ds, cohorts, item_db, item_ext)
    else:
        # public users are read whatever their block: their rows leave the private ratings below
        ratings = ratings_from_triplets(item_db, item_ext, *_triplets(session, ds, "ratings", cohorts, public_too=True))
        private, users = _split_public_users(session, ds, ratings)
    return private, {"public": public_data(session, ds, item_db, item_ext, users)}


def public_data(session: Session, ds: Dataset, item_db: np.ndarray, item_ext: np.ndarray,
                users: PublicSource | None) -> PublicData:
    """DP-CMF's public inputs over the catalogue (item metadata, similarities, ``users``: the
    public users' rows), sources without entries left out."""
    sources = [_metadata(session, ds, item_db), _similarities(session, ds, item_db, item_ext), users]
    return PublicData(tuple(s for s in sources if s is not None and s.matrix.nnz > 0))


def public_users_source(session: Session, ds: Dataset, item_db: np.ndarray,
                        item_ext: np.ndarray) -> tuple[np.ndarray, PublicSource | None]:
    """(the row ids of users whose ratings of ``ds`` are public and who rated, their rows as the
    ``public_users`` source or None): every rating of theirs, whatever its block or period."""
    if ds.privacy_unit == USER_PERIOD:
        _, (u, i, v, _) = _dated(session, ds, (), public_too=True)  # no period: the public users' rows only
    else:
        u, i, v = ratings_store(session).triplets("ratings", ds.id, None, (), public_too=True)  # no cohort: theirs only
    public_ids = np.intersect1d(public_inputs.public_user_ids(session, ds.id), u)
    if len(public_ids) == 0:
        return public_ids, None
    return public_ids, split_public_users(ratings_from_triplets(item_db, item_ext, u, i, v), public_ids)[1]


def read_partition_rows(session: Session, ds: Dataset, cohorts: Cohorts, partition: UserPartition,
                        excluded_users: np.ndarray) -> Ratings:
    """One training partition's private rows, as :func:`load_ratings_only` reads them for its
    users (``user_period``: one row per (user, period)), without ``excluded_users`` (row ids: DP-CMF's
    public users). Only the partition's users' rows are read; cohorts are not settled here (the
    run's driver settled them before the read)."""
    item_db, item_ext = item_index(session, ds)
    if ds.privacy_unit == USER_PERIOD:
        cal, (u, i, v, created) = _dated(session, ds, cohorts, partition=partition)
        keep = ~np.isin(u, excluded_users)
        return unit_ratings(item_db, item_ext, u[keep], i[keep], v[keep], created[keep], cal)
    u, i, v = ratings_store(session).triplets("ratings", ds.id, None, cohorts, partition=partition)
    keep = ~np.isin(u, excluded_users)
    return ratings_from_triplets(item_db, item_ext, u[keep], i[keep], v[keep])


def settle_run_cohorts(session: Session, cohorts: Cohorts) -> None:
    """Settle the cohort of every user created since the last read, as a run's in-process read
    does first (a function of each user's own creation only)."""
    if cohorts is not None and (cal := block_store.calendar(session)) is not None:
        block_store.settle_cohorts(session, cal)


LOADERS: dict[DataKind, Loader] = {
    "ratings": load_ratings_only,
    "ratings+public": load_ratings_and_public,
    "votes": load_votes,
}


def load_training_inputs(session: Session, ds: Dataset, algo: Algorithm[Any, Any], *,
                         local_epsilon: float | None = None, cohorts: Cohorts = None) -> tuple[Ratings, dict[str, Any]]:
    """The training data of ``algo`` on ``ds`` (the loader of its declared data kind) and the
    extra keyword arguments of its ``train``.

    ``local_epsilon`` (votes only): read only the bits randomised at ingestion with exactly this
    ε0 (a free, pre-randomised run); any other row is never read. ``cohorts``: the blocks the
    run's reservation charged (None only for a run reserved before blocks existed).
    """
    if local_epsilon is not None:
        if algo.data != "votes":
            raise ValueError("local_epsilon filters votes only")
        return load_votes(session, ds, cohorts, local_epsilon=local_epsilon)
    return LOADERS[algo.data](session, ds, cohorts)
