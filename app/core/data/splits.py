"""Deterministic, seeded evaluation splits (docs/algorithms.md §1, "Evaluation protocols").

* :func:`random_split` - rating prediction: a random partition of the ratings (80/10/10).
* :func:`heldout_users_split` - ranking: ratings >= 4 are positives; users with >= 5 positives are
  eligible; V validation and V test users are held out and their positives split into a query
  (history, 80%) and a target (20%).
* :func:`load_ml1m_rating_split` / :func:`load_ml1m_ranking_split` - the canonical MovieLens-1M
  splits shipped in ``ml-1m/splits/`` (same structures as the functions above).

Conventions of the held-out-users split (identical for the generated and the canonical split):
train holds the positives of the *eligible* users that are not held out; the item space of train,
query and target is the set of items positively rated by train users (items no train user liked
cannot be scored by a model trained on them, so they are dropped from queries and targets too).
Values are 1.0 (binary implicit feedback, the ML-20M setting of the DPALS paper, Gamma_M = 1)
unless ``binary=False``, which keeps the original ratings.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.data.datasets import _read_bytes, dataset_path, load_ml1m
from app.core.data.ratings import Ratings

__all__ = [
    "HeldoutSet",
    "HeldoutSplit",
    "heldout_users_split",
    "load_ml1m_ranking_split",
    "load_ml1m_rating_split",
    "merge",
    "random_split",
]


# ---------------------------------------------------------------------------- random split
def random_split(
    ratings: Ratings, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[Ratings, ...]:
    """Partition the ratings at random into ``len(fractions)`` parts (same user/item id spaces).

    Part sizes are ``round(cumsum(fractions) * nnz)`` differences, so they sum to ``nnz`` exactly.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.ndim != 1 or len(fr) < 2 or np.any(~np.isfinite(fr)) or np.any(fr <= 0):
        raise ValueError(f"fractions must be >= 2 positive numbers, got {fractions!r}")
    if abs(fr.sum() - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1, got {fr.sum():.6g}")
    n = ratings.nnz
    bounds = np.rint(np.cumsum(fr) * n).astype(np.int64)
    bounds[-1] = n
    part = np.empty(n, dtype=np.int64)
    part[np.random.default_rng(seed).permutation(n)] = np.repeat(
        np.arange(len(fr)), np.diff(np.concatenate([[0], bounds]))
    )
    return tuple(ratings.select(part == p) for p in range(len(fr)))


def merge(*parts: Ratings) -> Ratings:
    """Union of disjoint rating sets sharing id spaces (e.g. train + valid to refit before test)."""
    if not parts:
        raise ValueError("merge needs at least one Ratings")
    first = parts[0]
    for p in parts[1:]:
        if not (np.array_equal(p.user_ids, first.user_ids) and np.array_equal(p.item_ids, first.item_ids)):
            raise ValueError("merge: all parts must share user and item id spaces")
    coo = [p.coo() for p in parts]
    return Ratings.from_indices(  # raises on a (user, item) pair present in two parts
        np.concatenate([c[0] for c in coo]),
        np.concatenate([c[1] for c in coo]),
        np.concatenate([c[2] for c in coo]),
        user_ids=first.user_ids,
        item_ids=first.item_ids,
    )


# ---------------------------------------------------------------------------- held-out users
@dataclass(frozen=True)
class HeldoutSet:
    """Held-out users' query (history) and target, one row per held-out user, same item space.

    ``query.user_ids`` == ``target.user_ids`` are the external ids of the held-out users; a user
    whose target row is empty is kept (for fold-in) but ignored by Recall@k / NDCG@k.
    """

    query: Ratings
    target: Ratings

    @property
    def n_users(self) -> int:
        return self.query.n_users

    @property
    def user_ids(self) -> np.ndarray:
        return self.query.user_ids

    def query_items(self, u: int) -> np.ndarray:
        """Item indices of held-out user ``u``'s history."""
        return self.query.user_row(u)[0]

    def target_items(self, u: int) -> np.ndarray:
        """Item indices of held-out user ``u``'s target."""
        return self.target.user_row(u)[0]

    def n_with_target(self) -> int:
        """Number of users that count in Recall@k (non-empty target)."""
        return int((self.target.user_counts() > 0).sum())


@dataclass(frozen=True)
class HeldoutSplit:
    """Ranking protocol split: train on ``train``; fold in ``valid``/``test`` queries, score targets."""

    train: Ratings
    valid: HeldoutSet
    test: HeldoutSet


def _n_query(n: np.ndarray, query_fraction: float) -> np.ndarray:
    """ceil(query_fraction * n), robust to float error (n = 5, q = 0.8 -> 4 query, 1 target)."""
    return np.ceil(np.round(query_fraction * n, 9)).astype(np.int64)


def _build_heldout_split(
    users: np.ndarray,
    items: np.ndarray,
    values: np.ndarray,
    train_users: np.ndarray,
    held: dict[str, tuple[np.ndarray, np.ndarray]],
) -> HeldoutSplit:
    """Assemble the split from positive (user, item, value) triples.

    ``held[name] = (held-out user ids, is_query flag per triple of those users, in triple order)``
    is evaluated with ``train_users`` defining the train rows; items = items of train triples.
    """
    in_train = np.isin(users, train_users)
    item_space = np.unique(items[in_train])
    train = Ratings.from_arrays(
        users[in_train], items[in_train], values[in_train], user_ids=train_users, item_ids=item_space
    )
    sets = {}
    for name, (uids, is_query_of) in held.items():
        mine = np.isin(users, uids)
        u, i, v = users[mine], items[mine], values[mine]
        keep = np.isin(i, item_space)
        q = is_query_of[keep]
        u, i, v = u[keep], i[keep], v[keep]
        # Dense indices directly (uids and item_space are sorted): also works for zero users.
        ui, ii = np.searchsorted(uids, u), np.searchsorted(item_space, i)
        sets[name] = HeldoutSet(
            query=Ratings.from_indices(ui[q], ii[q], v[q], user_ids=uids, item_ids=item_space),
            target=Ratings.from_indices(ui[~q], ii[~q], v[~q], user_ids=uids, item_ids=item_space),
        )
    return HeldoutSplit(train=train, valid=sets["valid"], test=sets["test"])


def heldout_users_split(
    ratings: Ratings,
    n_valid: int,
    n_test: int,
    seed: int = 0,
    *,
    positive_threshold: float = 4.0,
    min_positives: int = 5,
    query_fraction: float = 0.8,
    binary: bool = True,
) -> HeldoutSplit:
    """Held-out-users ranking split (docs/algorithms.md §1, the ranking protocol).

    Positives: ratings >= ``positive_threshold``. Users with >= ``min_positives`` positives are
    eligible; ``n_valid`` + ``n_test`` of them are drawn at random and held out, the rest form
    train. Each held-out user's positives (restricted to train's item space) are shuffled; the
    first ceil(query_fraction * n) form the query, the rest the target.
    """
    if n_valid < 0 or n_test < 0:
        raise ValueError("n_valid and n_test must be >= 0")
    if not 0.0 < query_fraction < 1.0:
        raise ValueError(f"query_fraction must be in (0, 1), got {query_fraction}")
    if min_positives < 1:
        raise ValueError("min_positives must be >= 1")
    rows, cols, vals = ratings.coo()
    pos = vals >= positive_threshold
    rows, cols, vals = rows[pos], cols[pos], vals[pos]
    eligible = np.flatnonzero(np.bincount(rows, minlength=ratings.n_users) >= min_positives)
    if n_valid + n_test >= len(eligible):
        raise ValueError(
            f"cannot hold out {n_valid}+{n_test} users: only {len(eligible)} users have "
            f">= {min_positives} positives (train would be empty)"
        )
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(eligible)
    valid_u, test_u = np.sort(chosen[:n_valid]), np.sort(chosen[n_valid : n_valid + n_test])
    train_u = np.sort(chosen[n_valid + n_test :])
    keep = np.isin(rows, eligible)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    values = np.ones_like(vals) if binary else vals

    # Items of train users define the item space; drop other items before the 80/20 cut.
    in_space = np.isin(cols, np.unique(cols[np.isin(rows, train_u)]))
    held_rows = np.isin(rows, chosen[: n_valid + n_test]) & in_space
    # Random order within each held-out user: sort by (user, random key).
    order = np.flatnonzero(held_rows)
    order = order[np.lexsort((rng.random(len(order)), rows[order]))]
    r_sorted = rows[order]
    starts = np.searchsorted(r_sorted, r_sorted, side="left")
    rank = np.arange(len(order)) - starts
    counts = np.bincount(r_sorted, minlength=ratings.n_users)
    is_query = np.zeros(len(rows), dtype=bool)
    is_query[order] = rank < _n_query(counts, query_fraction)[r_sorted]

    uid, iid = ratings.user_ids, ratings.item_ids
    users, items = uid[rows], iid[cols]
    held = {}
    for name, members in (("valid", valid_u), ("test", test_u)):
        mine = np.isin(rows, members)
        held[name] = (np.sort(uid[members]), is_query[mine])
    return _build_heldout_split(users, items, values, uid[train_u], held)


# ---------------------------------------------------------------------------- canonical ML-1M
_RATING_FOLDS = {b"train": 0, b"validation": 1, b"test": 2}


def _coded_table(raw: bytes, codes: dict[bytes, int], ncols: int) -> np.ndarray:
    """Parse a CSV whose trailing text columns take values in ``codes``: replace them by ints."""
    body = raw.split(b"\n", 1)[1] if b"\n" in raw else b""
    for word, code in sorted(codes.items(), key=lambda kv: -len(kv[0])):
        body = body.replace(b"," + word, b"," + str(code).encode())
    if not body.strip():
        return np.empty((0, ncols), dtype=np.int64)
    try:
        return np.loadtxt(io.BytesIO(body), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise ValueError(f"unexpected label in a split file (known: {sorted(codes)}): {exc}") from None


def _pair_positions(ratings: Ratings, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """CSR-order positions in ``ratings`` of external (user, item) pairs (ValueError if absent)."""
    rows, cols, _ = ratings.coo()
    n_items = ratings.n_items
    keys = rows * n_items + cols  # sorted: CSR order with sorted indices
    u = np.searchsorted(ratings.user_ids, users)
    i = np.searchsorted(ratings.item_ids, items)
    u = np.clip(u, 0, ratings.n_users - 1)
    i = np.clip(i, 0, n_items - 1)
    ok = (ratings.user_ids[u] == users) & (ratings.item_ids[i] == items)
    q = u * n_items + i
    pos = np.clip(np.searchsorted(keys, q), 0, max(len(keys) - 1, 0))
    ok &= keys[pos] == q
    if not ok.all():
        bad = np.flatnonzero(~ok)[:3]
        raise ValueError(f"split file refers to (user, item) pairs not in the ratings, e.g. "
                         f"{list(zip(users[bad].tolist(), items[bad].tolist(), strict=True))}")
    return pos


def load_ml1m_rating_split(root: str | Path | None = None) -> tuple[Ratings, Ratings, Ratings]:
    """Canonical ML-1M 80/10/10 rating split -> (train, valid, test), sharing ML-1M's id spaces."""
    ratings = load_ml1m(root, with_features=False).ratings
    path = dataset_path("ml-1m", "splits", "rating_80_10_10.csv.gz", root=root)
    table = _coded_table(_read_bytes(path), _RATING_FOLDS, 3)
    if len(table) != ratings.nnz:
        raise ValueError(f"{path} has {len(table)} rows but ML-1M has {ratings.nnz} ratings")
    fold = np.full(ratings.nnz, -1, dtype=np.int64)
    fold[_pair_positions(ratings, table[:, 0], table[:, 1])] = table[:, 2]
    if np.any(fold < 0):
        raise ValueError(f"{path} does not assign every rating to a fold")
    train, validation, test = (ratings.select(fold == f) for f in range(3))
    return train, validation, test


def load_ml1m_ranking_split(
    root: str | Path | None = None, *, positive_threshold: float = 4.0, binary: bool = True
) -> HeldoutSplit:
    """Canonical ML-1M held-out-users split (4,834 train / 600 validation / 600 test users)."""
    ratings = load_ml1m(root, with_features=False).ratings
    roles = {b"train": 0, b"validation": 1, b"test": 2}
    users_tab = _coded_table(
        _read_bytes(dataset_path("ml-1m", "splits", "ranking_users.csv.gz", root=root)), roles, 2
    )
    held_tab = _coded_table(
        _read_bytes(dataset_path("ml-1m", "splits", "ranking_heldout.csv.gz", root=root)),
        {**roles, b"history": 3, b"target": 4},
        4,
    )
    rows, cols, vals = ratings.coo()
    pos = vals >= positive_threshold
    users, items, vals = ratings.user_ids[rows[pos]], ratings.item_ids[cols[pos]], vals[pos]
    values = np.ones_like(vals) if binary else vals
    train_u = np.sort(users_tab[users_tab[:, 1] == 0, 0])
    held = {}
    for name, code in (("valid", 1), ("test", 2)):
        uids = np.sort(users_tab[users_tab[:, 1] == code, 0])
        tab = held_tab[held_tab[:, 2] == code]
        if not np.isin(tab[:, 0], uids).all():
            raise ValueError(f"ranking_heldout lists {name} rows of users not marked {name}")
        # Flag each positive of these users as query (listed as history) or not.
        mine = np.isin(users, uids)
        key_all = users[mine].astype(np.int64) * (1 << 32) + items[mine]
        key_hist = tab[tab[:, 3] == 3, 0] * (1 << 32) + tab[tab[:, 3] == 3, 1]
        key_tgt = tab[tab[:, 3] == 4, 0] * (1 << 32) + tab[tab[:, 3] == 4, 1]
        listed = np.isin(key_all, np.concatenate([key_hist, key_tgt]))
        if listed.sum() != len(tab):
            raise ValueError(f"ranking_heldout {name} rows are not all positives of ML-1M")
        # Unlisted positives are outside train's item space and get dropped by the builder.
        held[name] = (uids, np.isin(key_all, key_hist))
    split = _build_heldout_split(users, items, values, train_u, held)
    for name in ("valid", "test"):
        hs: HeldoutSet = getattr(split, name)
        n_listed = int((held_tab[:, 2] == (1 if name == "valid" else 2)).sum())
        if hs.query.nnz + hs.target.nnz != n_listed:
            raise ValueError(f"canonical {name} rows fall outside the train users' item space")
    return split
