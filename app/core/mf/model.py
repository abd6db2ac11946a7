"""The public output of a training run: everything a published model version contains.

A :class:`PublicModel` holds only differentially private (or, for the non-private baseline,
explicitly non-private) quantities: item factors V, the DP global mean, DP item counts, the
frequent (trained) item set, DP item biases, the configuration and the run's ``DpEvent``. It never holds a user
embedding or a rating.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from dp_accounting import dp_event
from numpy.typing import ArrayLike

__all__ = ["PublicModel", "UserRegularisation"]


@dataclass(frozen=True)
class UserRegularisation:
    """The privileged user solve: ridge ``reg * c**exponent + gravity * VᵀV`` (c = #ratings) and
    the optional per-user centring offset.

    Loss of Chien et al. 2021 (arXiv:2107.09802, Eq. 35) with the normaliser folded into the public constant ``reg``.
    """

    reg: float
    exponent: float
    gravity: float = 0.0
    bias_shrinkage: float | None = None  # None: no per-user centring

    def ridge(self, counts: np.ndarray) -> np.ndarray:
        counts = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)
        return self.reg * counts**self.exponent

    def user_bias(self, residual_sums: ArrayLike, counts: ArrayLike) -> np.ndarray:
        """Shrunken own-mean offset b_i = Σ_j (r_ij − m̃) / (c_i + s), from the user's own ratings.

        Privileged: a function of user i's data only, so centring by it keeps each user's
        contribution to every release bounded by the same clipping norms (and is recomputed at
        fold-in). Zero when centring is off.
        """
        if self.bias_shrinkage is None:
            return np.zeros(np.shape(counts))
        return np.asarray(residual_sums, dtype=np.float64) / (np.asarray(counts, dtype=np.float64) + self.bias_shrinkage)


@dataclass(frozen=True, eq=False)
class PublicModel:
    """Published item-side state of a (DP) matrix factorisation model."""

    algorithm: str
    item_ids: np.ndarray
    item_factors: np.ndarray  # (n_items, rank); zero rows for items that were not trained
    trained_mask: np.ndarray  # bool (n_items,): the DP "frequent" set
    item_counts: np.ndarray  # DP noisy counts (first count release), floored at 1
    global_mean: float  # DP mean used for centring
    user_reg: UserRegularisation
    config: dict[str, Any]
    event: dp_event.DpEvent | None  # None only for the non-private baseline
    metadata: dict[str, Any] = field(default_factory=dict)
    # DP item biases b̃_j; None (no item bias) becomes zeros in __post_init__, so it is always an array
    item_biases: np.ndarray = None  # type: ignore[assignment]  # None is replaced by zeros at construction

    def __post_init__(self) -> None:
        n = len(self.item_ids)
        biases = np.zeros(n) if self.item_biases is None else self.item_biases
        object.__setattr__(self, "item_biases", biases)
        if np.shape(biases) != (n,) or not np.all(np.isfinite(biases)):
            raise ValueError("item_biases must hold one finite value per item")
        if self.item_factors.ndim != 2 or self.item_factors.shape[0] != n:
            raise ValueError("item_factors must have one row per item")
        if self.trained_mask.shape != (n,) or self.item_counts.shape != (n,):
            raise ValueError("trained_mask and item_counts must have one entry per item")
        if not np.all(np.isfinite(self.item_factors)):
            raise ValueError("item factors contain NaN or infinite values")
        if np.any(self.item_factors[~np.asarray(self.trained_mask, dtype=bool)]):
            raise ValueError("untrained items must have zero factor rows")

    @cached_property
    def trained_rows(self) -> np.ndarray:
        """Indices of the trained items (read-only)."""
        rows = np.flatnonzero(self.trained_mask)
        rows.setflags(write=False)
        return rows

    @cached_property
    def trained_factors(self) -> np.ndarray:
        """The trained items' factor rows as one contiguous read-only block.

        Every score product runs on this one array (same shape, same memory), so the full
        scoring path and the serving path's trained-rows path round every dot product alike:
        BLAS rounds a row differently depending on its position in the matrix it multiplies.
        """
        block = np.ascontiguousarray(self.item_factors[self.trained_rows])
        block.setflags(write=False)
        return block

    @property
    def rank(self) -> int:
        return int(self.item_factors.shape[1])

    @property
    def n_items(self) -> int:
        return int(self.item_factors.shape[0])

    def item_index(self) -> dict[Any, int]:
        """External item id -> row of ``item_factors``."""
        return {iid: i for i, iid in enumerate(self.item_ids.tolist())}
