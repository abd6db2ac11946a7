"""A utility indicator at publish time: how much of a model stands clear of its noise.

Post-processing only: the inputs are a model's released item counts, the standard deviation of
the noise those counts carry (public: the release's L2 sensitivity times its noise multiplier,
both in the published config) and the released trained set (for DPALS, less the items its count
floors trained because their counts clear the noise). No private datum is read, so the indicator
is free and may be shown with the model.

A released count c̃_j = c_j + N(0, σ²) that is below ``NOISE_MARGIN``·σ cannot be told from an
item nobody rated; the item's other releases (its Gram, its linear term, its bias sum) carry the
same users' data under noise of the same order (DPALS calibrates every release by one factor), so
where few trained items' counts clear their noise the item factors are mostly noise and the model
ranks like DP popularity (rating objective: predicts like the user mean). Checked on the public
data sets with the ε-aware defaults (docs/benchmarks.md, "Utility indicator"): the share is below
``NOISE_DOMINATED_BELOW`` exactly in the cells where the default model is within about one seed
std of the free baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["NOISE_MARGIN", "NOISE_DOMINATED_BELOW", "CountRelease", "UtilityIndicator", "utility_indicator"]

NOISE_MARGIN = 3.0  # a count clears its noise when c̃_j > NOISE_MARGIN · σ
NOISE_DOMINATED_BELOW = 0.1  # below this share of considered items clearing their noise: noise-dominated

NOISE_DOMINATED_MESSAGE = ("noise-dominated: this model ranks like popularity at this epsilon; "
                           "raise epsilon or wait for more users")


@dataclass(frozen=True)
class CountRelease:
    """A model's released item counts, their noise std and the items whose factors were trained."""

    counts: np.ndarray
    noise_std: float
    considered: np.ndarray  # bool mask: the trained items the share reads (DPALS: those the floors did not add)


@dataclass(frozen=True)
class UtilityIndicator:
    """Share of the considered items whose released count clears ``NOISE_MARGIN`` noise stds."""

    count_noise_std: float
    considered_items: int
    clearing_items: int
    noise_dominated: bool

    @property
    def clearing_share(self) -> float:
        return self.clearing_items / self.considered_items if self.considered_items else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "count_noise_std": round(self.count_noise_std, 6),
            "margin": NOISE_MARGIN,
            "considered_items": self.considered_items,
            "clearing_items": self.clearing_items,
            "clearing_share": round(self.clearing_share, 6),
            "noise_dominated": self.noise_dominated,
            "message": NOISE_DOMINATED_MESSAGE if self.noise_dominated else None,
        }


def utility_indicator(release: CountRelease) -> UtilityIndicator:
    """The indicator of one released model (post-processing of ``release``)."""
    if not (np.isfinite(release.noise_std) and release.noise_std >= 0):
        raise ValueError("the count noise std must be finite and >= 0")
    considered = np.asarray(release.considered, dtype=bool)
    counts = np.asarray(release.counts, dtype=np.float64)
    if counts.shape != considered.shape:
        raise ValueError("counts and the considered mask must have one entry per item")
    n = int(np.count_nonzero(considered))
    clearing = int(np.count_nonzero(counts[considered] > NOISE_MARGIN * release.noise_std))
    dominated = n == 0 or clearing < NOISE_DOMINATED_BELOW * n
    return UtilityIndicator(count_noise_std=float(release.noise_std), considered_items=n,
                            clearing_items=clearing, noise_dominated=dominated)
