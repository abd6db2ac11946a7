"""A ratings matrix held twice: CSR (rows = users) and CSC (columns = items), with id maps.

Every algorithm in the core reads ratings through :class:`Ratings`. Construction validates the
input once (finite values, optional range, no duplicate (user, item) pairs) so that the solvers
can assume clean data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from app.core.arrays import HeldBytes

__all__ = ["Ratings"]


def _index_ids(raw: np.ndarray, known: np.ndarray | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Map raw external ids to dense indices; return (ids, index per entry)."""
    if known is None:
        ids, idx = np.unique(raw, return_inverse=True)
        return ids, idx.astype(np.int64)
    known = np.asarray(known)
    if len(raw) == 0:
        if len(np.unique(known)) != len(known):
            raise ValueError(f"the {what} id list contains duplicates")
        return known, np.zeros(0, dtype=np.int64)
    order = np.argsort(known, kind="stable")
    sorted_known = known[order]
    if len(np.unique(sorted_known)) != len(sorted_known):
        raise ValueError(f"the {what} id list contains duplicates")
    pos = np.searchsorted(sorted_known, raw)
    pos = np.clip(pos, 0, max(len(sorted_known) - 1, 0))
    if len(sorted_known) == 0 or not np.array_equal(sorted_known[pos], raw):
        missing = raw[(len(sorted_known) == 0) | (sorted_known[pos] != raw)] if len(sorted_known) else raw
        raise ValueError(f"unknown {what} id(s), e.g. {missing[:3].tolist()}")
    return known, order[pos].astype(np.int64)


@dataclass(frozen=True)
class Ratings(HeldBytes):
    """Explicit ratings of ``n_users`` users on ``n_items`` items.

    ``csr[u, i]`` is user ``u``'s rating of item ``i`` (stored entries only; an explicit 0.0 is a
    rating). ``user_ids[u]`` / ``item_ids[i]`` are the external ids.
    """

    csr: sp.csr_matrix
    csc: sp.csc_matrix
    user_ids: np.ndarray
    item_ids: np.ndarray
    _user_pos: dict[Any, int] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(
        cls,
        users: Sequence[Any] | np.ndarray,
        items: Sequence[Any] | np.ndarray,
        values: Sequence[float] | np.ndarray,
        *,
        user_ids: Sequence[Any] | np.ndarray | None = None,
        item_ids: Sequence[Any] | np.ndarray | None = None,
        rating_range: tuple[float, float] | None = None,
    ) -> Ratings:
        """Build from parallel (user, item, value) arrays of external ids.

        ``user_ids``/``item_ids`` fix the id universe (and thus the index order) so several
        matrices (e.g. train/test splits) share one index space; ids outside it raise.
        Raises ``ValueError`` on NaN/inf, values outside ``rating_range``, length mismatch or
        duplicate (user, item) pairs.
        """
        users = np.asarray(users)
        items = np.asarray(items)
        values = np.asarray(values, dtype=np.float64)
        if not (users.ndim == items.ndim == values.ndim == 1):
            raise ValueError("users, items and values must be one-dimensional")
        if not (len(users) == len(items) == len(values)):
            raise ValueError(
                f"users, items and values differ in length ({len(users)}, {len(items)}, {len(values)})"
            )
        if not np.all(np.isfinite(values)):
            raise ValueError("ratings contain NaN or infinite values")
        if rating_range is not None:
            lo, hi = rating_range
            if not lo < hi:
                raise ValueError(f"invalid rating range {rating_range}")
            if len(values) and (values.min() < lo or values.max() > hi):
                raise ValueError(f"ratings outside the range [{lo}, {hi}]")
        uids, uidx = _index_ids(users, None if user_ids is None else np.asarray(user_ids), "user")
        iids, iidx = _index_ids(items, None if item_ids is None else np.asarray(item_ids), "item")
        return cls.from_indices(uidx, iidx, values, user_ids=uids, item_ids=iids)

    @classmethod
    def from_indices(
        cls,
        rows: np.ndarray,
        cols: np.ndarray,
        values: np.ndarray,
        *,
        user_ids: np.ndarray,
        item_ids: np.ndarray,
    ) -> Ratings:
        """Build from dense indices into ``user_ids``/``item_ids`` (duplicates raise)."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError("ratings contain NaN or infinite values")
        shape = (len(user_ids), len(item_ids))
        coo = sp.coo_matrix((values, (rows, cols)), shape=shape)
        csr = coo.tocsr()  # sums duplicates; detect them by the entry count
        if csr.nnz != len(values):
            csr_count = sp.coo_matrix((np.ones(len(values)), (rows, cols)), shape=shape).tocsr()
            raise ValueError(
                f"duplicate (user, item) pairs: {int((csr_count.data > 1).sum())} pair(s) rated twice"
            )
        csr.sort_indices()
        csr.data = np.ascontiguousarray(csr.data, dtype=np.float64)
        csc = csr.tocsc()
        csc.sort_indices()
        return cls(csr=csr, csc=csc, user_ids=np.asarray(user_ids), item_ids=np.asarray(item_ids))

    @classmethod
    def from_csr(
        cls,
        indptr: np.ndarray,
        cols: np.ndarray,
        values: np.ndarray,
        *,
        user_ids: np.ndarray,
        item_ids: np.ndarray,
    ) -> Ratings:
        """Build from rows already in CSR order (``indptr``, each row's ``cols`` strictly ascending),
        without the sort of :meth:`from_indices` and its copies: the same matrix, the same dtypes.
        ``ValueError`` on NaN/inf, a column out of range, or a row whose columns
        are not strictly ascending (a duplicate pair included)."""
        indptr = np.asarray(indptr, dtype=np.int64)
        cols = np.asarray(cols)
        values = np.asarray(values, dtype=np.float64)
        n_users, n_items = len(user_ids), len(item_ids)
        if len(indptr) != n_users + 1 or indptr[0] != 0 or indptr[-1] != len(cols) or len(cols) != len(values):
            raise ValueError("indptr, cols and values do not describe one matrix")
        if not np.all(np.isfinite(values)):
            raise ValueError("ratings contain NaN or infinite values")
        if len(cols) and (int(cols.min()) < 0 or int(cols.max()) >= n_items):
            raise ValueError("a column lies outside the item ids")
        index = np.int32 if max(len(cols), n_items) < 2**31 else np.int64  # scipy's choice in from_indices
        cols = cols.astype(index, copy=False)
        rising = np.diff(cols) > 0
        starts = indptr[1:-1]
        rising[starts[(starts > 0) & (starts < len(cols))] - 1] = True  # a row's first entry follows another row
        if not rising.all():
            raise ValueError("a row's columns are not strictly ascending (a duplicate (user, item) pair or unsorted)")
        del rising
        csr = sp.csr_matrix((values, cols, indptr.astype(index)), shape=(n_users, n_items))
        csr.has_sorted_indices = True
        csc = csr.tocsc()
        csc.sort_indices()
        return cls(csr=csr, csc=csc, user_ids=np.asarray(user_ids), item_ids=np.asarray(item_ids))

    # ------------------------------------------------------------------ views
    @property
    def n_users(self) -> int:
        return int(self.csr.shape[0])

    @property
    def n_items(self) -> int:
        return int(self.csr.shape[1])

    @property
    def nnz(self) -> int:
        return int(self.csr.nnz)

    def coo(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row indices, column indices, values) in CSR order."""
        rows = np.repeat(np.arange(self.n_users, dtype=np.int64), np.diff(self.csr.indptr))
        return rows, self.csr.indices.astype(np.int64), self.csr.data

    def user_counts(self) -> np.ndarray:
        return np.diff(self.csr.indptr)

    def item_counts(self) -> np.ndarray:
        return np.diff(self.csc.indptr)

    def user_row(self, u: int) -> tuple[np.ndarray, np.ndarray]:
        """(item indices, values) of user ``u``."""
        lo, hi = self.csr.indptr[u], self.csr.indptr[u + 1]
        return self.csr.indices[lo:hi], self.csr.data[lo:hi]

    def user_index(self, user_id: Any) -> int:
        """Dense index of an external user id (``KeyError`` if unknown)."""
        if not self._user_pos:
            self._user_pos.update({uid: i for i, uid in enumerate(self.user_ids.tolist())})
        return self._user_pos[user_id]

    def select(self, mask: np.ndarray) -> Ratings:
        """The ratings whose CSR-order positions are ``True`` in ``mask`` (same id spaces)."""
        rows, cols, vals = self.coo()
        mask = np.asarray(mask, dtype=bool)
        return Ratings.from_indices(
            rows[mask], cols[mask], vals[mask], user_ids=self.user_ids, item_ids=self.item_ids
        )

    def with_values(self, values: np.ndarray) -> Ratings:
        """Same pattern, new values given in CSR order."""
        rows, cols, _ = self.coo()
        return Ratings.from_indices(rows, cols, values, user_ids=self.user_ids, item_ids=self.item_ids)
