"""ε-aware default hyper-parameters: a pure function of public inputs only.

When a training request gives no hyper-parameters the service resolves them here from the target
ε and δ, the objective, the data set's public rating range, and the public catalogue size. No
private statistic enters (tested): tuning on the private data would itself cost budget.

How the rule was derived (``python -m benchmarks defaults-search``): random searches scored on
validation splits of public benchmark data (MovieLens-1M canonical splits), then a few smooth
laws instead of a per-data-set lookup, because the rule is judged on data it never saw:

* The Wiener noise filter (``noise_filter``, :func:`app.core.dpals.wiener_filter`) adapts to the
  noise level by itself: its κ is proportional to the release noise variance, so one value serves
  every ε. Rare items fade to their baseline instead of carrying pure noise, which is why the
  rule trains the whole catalogue at every ε (``frequent_fraction`` 1 for ratings).
* Item biases get the larger share of the budget (``bias_noise_ratio`` 0.5): at small ε the
  biases are most of what can be learnt, and their shrinkage is noise-aware.
* Clipping and bias priors scale with the half range h of the rating scale, so a 1–10 or
  −10…10 scale gets the same rule as 1–5.
* Rank grows with ε (more signal survives the noise); ridge stays fixed relative to clipping.

=================  ===========  ===========  ===========
rating objective   ε < 2        2 ≤ ε < 8    ε ≥ 8
=================  ===========  ===========  ===========
rank               8            16           16
n_steps            1            2            3
clip_rating        0.5 h        0.75 h       h
clip_bias          0.5 h        0.5 h        0.5 h
=================  ===========  ===========  ===========

The ranking objective (positives only) adds the DP-popularity prior, strongest at small ε, and
trains only the most frequent items where the noise would swamp the rest.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["RULE_VERSION", "default_hyperparameters"]

RULE_VERSION = 1


def _band(epsilon: float) -> int:
    """0: ε < 2, 1: 2 ≤ ε < 8, 2: ε ≥ 8."""
    return 0 if epsilon < 2 else 1 if epsilon < 8 else 2


def _rating_defaults(epsilon: float, half_range: float) -> dict[str, Any]:
    band = _band(epsilon)
    return {
        "objective": "rating",
        "rank": (8, 16, 16)[band],
        "n_steps": (1, 2, 3)[band],
        "reg_item": 640.0,
        "item_reg_exponent": 0.0,
        "reg_user": 0.5,
        "user_reg_exponent": 0.5,
        "user_bias_shrinkage": 10.0,
        "contribution_mode": "uniform",
        "contribution_bound": 240,
        "frequent_fraction": 1.0,
        "clip_user": 1.0,
        "clip_rating": (0.5, 0.75, 1.0)[band] * half_range,
        "gram_noise_ratio": 2.0,
        "count_noise_ratio": 2.0,
        "mean_noise_ratio": 2.0,
        "mean_mode": "dp",
        "user_centering": True,
        "item_bias": True,
        "clip_bias": 0.5 * half_range,
        "bias_noise_ratio": 0.5,
        "item_bias_shrinkage": 5.0,
        "item_bias_prior_std": 0.125 * half_range,
        "noise_filter": 10.0,
    }


def _ranking_defaults(epsilon: float, n_items: int) -> dict[str, Any]:
    band = _band(epsilon)
    # about 200 trained items at small ε, the top 10-20 % above (never fewer than 50)
    fraction = min(1.0, max(50.0 / max(n_items, 1), (0.05, 0.1, 0.2)[band]))
    return {
        "objective": "ranking",
        "rank": (16, 32, 64)[band],
        "n_steps": (1, 2, 3)[band],
        "reg_item": 160.0,
        "item_reg_exponent": 0.5,
        "reg_user": 0.5,
        "user_reg_exponent": 0.0,
        "reg_gravity": 0.5,
        "contribution_mode": "tail",
        "contribution_bound": 60,
        "frequent_fraction": round(fraction, 4),
        "clip_user": 0.5,
        "clip_rating": 1.0,
        "gram_noise_ratio": 2.0,
        "count_noise_ratio": 1.0,
        "mean_mode": "public",
        "public_mean": 0.0,
        "user_centering": False,
        "item_bias": False,
        "popularity_prior": (1.0, 0.3, 0.1)[band],
        "noise_filter": (10.0, 1.0, 1.0)[band],
    }


def default_hyperparameters(
    *,
    objective: str,
    epsilon: float,
    delta: float,
    rating_range: tuple[float, float],
    n_items: int,
    max_users: int | None = None,
) -> dict[str, Any]:
    """The DPALS / DP-CMF hyper-parameters for a run at (ε, δ) from public facts only.

    ``max_users`` is an admin-declared public bound on the number of users (unused by rule 1;
    accepted so that callers pass every public fact the rule may grow to use).
    """
    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        raise ValueError("epsilon must be finite and > 0, delta in (0, 1)")
    lo, hi = rating_range
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("rating_range must be finite with lo < hi")
    if n_items < 0 or (max_users is not None and max_users < 1):
        raise ValueError("n_items must be >= 0 and max_users >= 1")
    if objective == "rating":
        params = _rating_defaults(epsilon, 0.5 * (hi - lo))
    elif objective == "ranking":
        params = _ranking_defaults(epsilon, n_items)
    else:
        raise ValueError("objective must be 'rating' or 'ranking'")
    return {**params, "defaults_rule": RULE_VERSION}
