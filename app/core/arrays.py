"""Array type aliases used across the numeric core (``numpy.typing``), and the bytes a value's arrays hold."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

__all__ = ["AnyArray", "BoolArray", "FloatArray", "IntArray", "HeldBytes", "held_bytes"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
AnyArray = NDArray[Any]  # item ids: int64 or unicode strings, as stored


def held_bytes(value: Any) -> int:
    """The bytes of the arrays ``value`` holds: an array's, a sparse matrix's parts, and those of a
    dataclass's fields and of a tuple's, list's or dict's entries, recursively (anything else: 0)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if sp.issparse(value):
        return sum(held_bytes(getattr(value, part, None)) for part in ("data", "indices", "indptr", "row", "col"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(held_bytes(getattr(value, field.name)) for field in dataclasses.fields(value))
    if isinstance(value, tuple | list):
        return sum(held_bytes(entry) for entry in value)
    if isinstance(value, dict):
        return sum(held_bytes(entry) for entry in value.values())
    return 0


class HeldBytes:
    """``sys.getsizeof`` counts the arrays held (:func:`held_bytes`), not the bare object's few dozen
    bytes: what a cluster's scheduler (``dask.sizeof``) reads as a task result's size, so that it
    runs a task where its large inputs are instead of moving them (issue 28)."""

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + held_bytes(self)
