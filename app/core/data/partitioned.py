"""A rating matrix kept in user partitions, each read where it is used (issue 28).

On a cluster the driver never holds the whole matrix: it holds a :class:`PartitionedRatings`, the
public catalogue and one :class:`PartitionReader` per partition, a small picklable callable that
the cluster runs on a worker to read that partition's users (every rating of each, over the whole
catalogue in ``item_ids`` order). The reader is where the data lives: a ``COPY`` of a user range
from PostgreSQL (:mod:`app.db.partitions`) or a Parquet file of a snapshot
(:mod:`app.core.data.snapshot`). Users named in ``excluded_labels`` (DP-CMF's public users, whose
rows are a public input) are dropped on the worker, before any statistic is computed.

Every user must be in exactly one partition (the readers' contract): then the partitions together
are the matrix a single read would give, and the distributed driver publishes what the in-process
trainer publishes on it (:func:`gather` is that single read, for the in-process path and the tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import scipy.sparse as sp

from app.core.data.ratings import Ratings

__all__ = ["PartitionReader", "PartitionedRatings", "read_partition", "gather", "stack", "without_users"]


class PartitionReader(Protocol):
    """Reads one partition (picklable: it crosses to the worker that runs it)."""

    def __call__(self) -> Ratings: ...


@dataclass(frozen=True)
class PartitionedRatings:
    """The ratings as user partitions read on demand: the public catalogue (``item_ids``), one
    reader per partition, and the labels of users the readers' rows must not include."""

    item_ids: np.ndarray
    readers: tuple[PartitionReader, ...]
    excluded_labels: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.readers:
            raise ValueError("a partitioned matrix needs at least one partition")

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def n_partitions(self) -> int:
        return len(self.readers)


def without_users(ratings: Ratings, labels: frozenset[str]) -> Ratings:
    """``ratings`` without the rows of users whose id (as a string) is in ``labels``."""
    if not labels:
        return ratings
    keep = np.array([str(u) not in labels for u in ratings.user_ids.tolist()], dtype=bool)
    if keep.all():
        return ratings
    rows = np.flatnonzero(keep)
    csr = ratings.csr[rows]
    coo = csr.tocoo()
    return Ratings.from_indices(coo.row, coo.col, coo.data, user_ids=ratings.user_ids[rows], item_ids=ratings.item_ids)


def read_partition(reader: PartitionReader, item_ids: np.ndarray, excluded_labels: frozenset[str]) -> Ratings:
    """Partition ``reader``'s ratings (run where the partition is used), checked against the
    catalogue and without the excluded users."""
    part = reader()
    if part.n_items != len(item_ids):
        raise RuntimeError("a partition was read over a different catalogue")
    return without_users(part, excluded_labels)


def gather(data: PartitionedRatings) -> Ratings:
    """Every partition read here and stacked: the matrix the partitions make up, in one process."""
    parts = [read_partition(reader, data.item_ids, data.excluded_labels) for reader in data.readers]
    return stack(parts, data.item_ids)


def stack(parts: Sequence[Ratings], item_ids: np.ndarray) -> Ratings:
    """Disjoint user partitions over one catalogue as one matrix (users in partition order)."""
    user_ids = np.concatenate([p.user_ids for p in parts]) if parts else np.empty(0, dtype=np.int64)
    if len(set(user_ids.tolist())) != len(user_ids):
        raise RuntimeError("a user was read in two partitions")
    coo = sp.vstack([p.csr for p in parts], format="coo") if parts else sp.coo_matrix((0, len(item_ids)))
    return Ratings.from_indices(coo.row, coo.col, coo.data, user_ids=user_ids, item_ids=item_ids)
