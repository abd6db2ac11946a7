"""The containers a cluster's tasks pass report the bytes they hold (``sys.getsizeof``, which
``dask.sizeof`` reads for objects it has no rule for): the scheduler's view of where the data is."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from app.core.arrays import HeldBytes, held_bytes
from app.core.data.ratings import Ratings


@dataclass(frozen=True)
class Nested(HeldBytes):
    table: np.ndarray
    parts: tuple[np.ndarray, ...]
    inner: Ratings | None
    label: str = "public"


def test_held_bytes_counts_arrays_sparse_parts_and_nested_containers():
    matrix = sp.random(30, 20, density=0.2, format="csr", random_state=0)
    parts = (np.zeros(7), np.zeros((3, 4), dtype=np.int16))
    assert held_bytes(matrix) == matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes
    assert held_bytes({"a": parts, "b": [np.ones(5)]}) == 56 + 24 + 40
    assert held_bytes("text") == held_bytes(3.5) == held_bytes(None) == 0
    nested = Nested(np.zeros((10, 10)), parts, None)
    assert held_bytes(nested) == 800 + 56 + 24
    assert sys.getsizeof(nested) >= 880  # what the scheduler reads


def test_a_ratings_matrix_reports_both_layouts_and_its_ids():
    ratings = Ratings.from_arrays(np.arange(50) % 7, np.arange(50) % 11, np.linspace(1, 5, 50))
    layouts = sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in (ratings.csr, ratings.csc))
    assert sys.getsizeof(ratings) >= layouts + ratings.user_ids.nbytes + ratings.item_ids.nbytes
    assert sys.getsizeof(Nested(np.zeros(1), (), ratings)) >= layouts
