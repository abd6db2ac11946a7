"""The core's partitioned ratings (issue 28): readers' rows checked, excluded users dropped where a
partition is read, partitions stacked into the matrix a single read gives; the service's user id
ranges cover every id once."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.data.partitioned import PartitionedRatings, gather, read_partition, stack, without_users
from app.core.data.ratings import Ratings
from app.db.partitions import id_ranges
from app.db.stores.ratings import UserPartition, partition_filter

ITEMS = np.array(["a", "b", "c"], dtype=object)


def _part(users: list[int], rows: list[int], cols: list[int], values: list[float], items=ITEMS) -> Ratings:
    return Ratings.from_indices(np.array(rows), np.array(cols), np.array(values, dtype=float),
                                user_ids=np.array(users), item_ids=items)


class Reader:
    """A picklable reader of a fixed partition (as a worker would run it)."""

    def __init__(self, part: Ratings) -> None:
        self.part = part

    def __call__(self) -> Ratings:
        return self.part


def test_partitions_stack_into_one_matrix_and_drop_excluded_users():
    first = _part([10, 11], [0, 0, 1], [0, 2, 1], [1.0, 2.0, 3.0])
    second = _part([12, 13], [0, 1], [2, 0], [4.0, 5.0])
    data = PartitionedRatings(ITEMS, (Reader(first), Reader(second)), frozenset({"13"}))
    whole = gather(data)
    assert whole.user_ids.tolist() == [10, 11, 12] and data.n_items == 3 and data.n_partitions == 2
    assert whole.csr.toarray().tolist() == [[1.0, 0.0, 2.0], [0.0, 3.0, 0.0], [0.0, 0.0, 4.0]]


def test_a_user_in_two_partitions_and_a_foreign_catalogue_are_refused():
    first = _part([10], [0], [0], [1.0])
    with pytest.raises(RuntimeError, match="two partitions"):
        stack([first, _part([10], [0], [1], [2.0])], ITEMS)
    with pytest.raises(RuntimeError, match="catalogue"):
        read_partition(Reader(_part([10], [0], [0], [1.0], items=ITEMS[:2])), ITEMS, frozenset())
    with pytest.raises(ValueError):
        PartitionedRatings(ITEMS, ())


def test_without_users_keeps_everyone_else_unchanged():
    part = _part([1, 2, 3], [0, 1, 2, 2], [0, 1, 1, 2], [1.0, 2.0, 3.0, 4.0])
    assert without_users(part, frozenset()) is part
    kept = without_users(part, frozenset({"2"}))
    assert kept.user_ids.tolist() == [1, 3] and kept.csr.toarray().tolist() == [[1.0, 0.0, 0.0], [0.0, 3.0, 4.0]]


@pytest.mark.parametrize(("low", "high", "parts"), [(1, 5, 4), (1, 3, 4), (7, 7, 3), (1, 100, 7), (5, 1000, 1),
                                                    (1, 2, 16)])
def test_user_id_ranges_cover_every_id_once_and_never_run_backwards(low: int, high: int, parts: int):
    ranges = id_ranges(low, high, parts)
    assert len(ranges) == parts and all(r.first <= r.end for r in ranges)
    covered = [i for r in ranges for i in range(r.first, r.end)]
    assert covered == list(range(low, high + 1))
    assert all(partition_filter(r) for r in ranges)  # every range is a valid filter


def test_no_users_give_empty_ranges():
    assert id_ranges(None, None, 3) == [UserPartition(0, 0)] * 3
    with pytest.raises(ValueError):
        id_ranges(1, 2, 0)
