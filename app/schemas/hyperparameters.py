"""Upper bounds on every training knob, checked before anything is reserved.

The algorithms' configs check what makes a run *correct* (lower bounds, types, relations between
knobs); this module bounds what makes a run *feasible* on one worker: release and step counts,
sizes, and the noise scales the exact discrete Gaussian sampler can draw
(:func:`app.core.privacy.discrete_noise.grid_gaussian`: an integer σ below 2^40). A request past
a bound is a 422 before the run is recorded, so no run is charged that cannot finish.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from app.core.algorithms import get_algorithm
from app.core.privacy.discrete_noise import grid_gaussian

__all__ = [
    "INTEGER_BOUNDS",
    "NUMBER_BOUNDS",
    "MAX_HYPERPARAMETERS",
    "MAX_MAGNITUDE",
    "bound_errors",
    "gaussian_multipliers",
    "sampler_refusal",
]

MAX_HYPERPARAMETERS = 64
"""Most keys in a request's ``hyperparameters`` (every config has fewer fields)."""
MAX_MAGNITUDE = 1e12
"""No numeric knob lies beyond this in absolute value (a bound for knobs not listed below)."""
_MAX_LIST = 16  # a list-valued knob (e.g. ``rating_range``) holds at most this many numbers

INTEGER_BOUNDS: dict[str, int] = {
    # sizes: memory and time of one worker (n_items x rank factors, rank^2 Grams per item chunk,
    # rank^3 solves per user; a dense eigen-decomposition of dense_max_items^2)
    "rank": 512,
    "dense_max_items": 20_000,
    # step and release counts: each step is a pass over the data and a set of releases
    "n_steps": 1_000,
    "average_last": 1_000,
    "few_steps": 1_000,  # at most n_steps (the config's check)
    "oja_iterations": 1_000,
    "user_cg_steps": 100,
    "grid_steps": 1_000_000,
    # contribution bounds: each enters a sensitivity and the coordinates one user can change
    "contribution_bound": 100_000,
    "bound_min": 100_000,  # at most contribution_bound (the config's check)
    "few_steps_bound": 100_000,  # rule 10: the B at or below which a run takes few_steps steps
    "votes_per_user": 100_000,
    "max_ratings_per_user": 100_000,
    "user_rows": 2**31 - 1,
}
"""Largest value of each integer knob (any algorithm that has it)."""

_RATIO = 1e3
NUMBER_BOUNDS: dict[str, tuple[float, float]] = {
    # noise ratios scale one release's noise against the calibrated multiplier: their spread is
    # the spread of the releases' multipliers, which the sampler's range bounds
    **{name: (1.0 / _RATIO, _RATIO) for name in (
        "gram_noise_ratio", "gravity_noise_ratio", "count_noise_ratio", "mean_noise_ratio",
        "bias_noise_ratio", "bound_noise_ratio", "eigenvalue_noise_ratio", "later_noise_scale")},
    "noise_multiplier": (0.0, 1e6),
    "objp_output_noise_multiplier": (0.0, 1e6),
    "epsilon": (0.0, 100.0),  # onebit's per-vote epsilon: e^epsilon stays a finite float
    "clamp": (0.0, 1e3),
    "clip_user": (0.0, 1e6),
    "clip_rating": (0.0, 1e6),
    "clip_bias": (0.0, 1e6),
    "row_clip": (0.0, 1e6),
    "nuclear_norm": (0.0, 1e9),
    # rule 9's laws in the released bound B (dpals.apply_bound_laws): a prior floor over B², a
    # ridge exponent, the B where the ridge stops growing (at most the contribution bound's bound)
    # and its ceiling
    "prior_bound_floor": (0.0, 1e9),
    "ridge_bound_exponent": (0.0, 10.0),
    "ridge_bound_reference": (0.0, 100_000.0),
    "ridge_bound_cap": (0.0, 1e6),
    "ridge_users_scale": (0.0, 1e6),  # rule 14: the ridge law's scale in the released user total
    # rule 10: the signal-to-noise ratio of an item's Gram from which it is trained (dpals.count_floor)
    "frequent_snr": (0.0, 1e6),
    "frequent_count_sigmas": (0.0, 1e6),  # ... and the count-noise stds a released count clears
    # rule 11: the count-noise stds above which an item the model in force trained stays trained
    "keep_trained_sigmas": (0.0, 1e6),
}
"""(lowest, highest) of each real knob: a ratio outside [1e-3, 1e3], a multiplier above 1e6 ...
Values <= 0 are left to the config's own positivity check (and its message)."""


def _numbers(value: Any) -> Iterator[Any]:
    """The scalars of a knob's value (a list's elements, or the value itself)."""
    if isinstance(value, list):
        yield from value
    else:
        yield value


def bound_errors(params: Mapping[str, Any]) -> list[str]:
    """Why ``params`` (a request's hyper-parameters) pass a bound; empty when none does."""
    errors: list[str] = []
    if len(params) > MAX_HYPERPARAMETERS:
        return [f"at most {MAX_HYPERPARAMETERS} hyper-parameters"]
    for name, value in params.items():
        if isinstance(value, (dict, list)) and (not isinstance(value, list) or len(value) > _MAX_LIST
                                                 or any(isinstance(v, (dict, list)) for v in value)):
            errors.append(f"{name[:64]}: a hyper-parameter is a scalar or a list of at most {_MAX_LIST} scalars")
            continue
        errors.extend(_scalar_errors(name, value))
    return errors


def _scalar_errors(name: str, value: Any) -> Iterator[str]:
    for number in _numbers(value):
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            continue  # types are the config's check
        if isinstance(number, float) and not math.isfinite(number):
            continue  # the config refuses non-finite values with its own message
        if abs(number) > MAX_MAGNITUDE:
            yield f"{name[:64]} must lie within ±{MAX_MAGNITUDE:g}, got {number:g}"
        elif name in INTEGER_BOUNDS and number > INTEGER_BOUNDS[name]:
            yield f"{name} must be at most {INTEGER_BOUNDS[name]}, got {number:g}"
        elif name in NUMBER_BOUNDS and number > 0 and not NUMBER_BOUNDS[name][0] <= number <= NUMBER_BOUNDS[name][1]:
            low, high = NUMBER_BOUNDS[name]
            yield f"{name} must lie in [{low:g}, {high:g}], got {number:g}"


# ----------------------------------------------------------------------------- the sampler's range
def gaussian_multipliers(event: Any) -> Iterator[float]:
    """Every Gaussian noise multiplier of a run's event (its JSON form, as the ledger stores it)."""
    if isinstance(event, dict):
        for key, value in event.items():
            if key == "noise_multiplier" and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield float(value)
            else:
                yield from gaussian_multipliers(value)
    elif isinstance(event, list):
        for value in event:
            yield from gaussian_multipliers(value)


def sampler_refusal(algorithm: str, event: Any, config: Mapping[str, Any], n_items: int) -> str | None:
    """Why the exact sampler cannot draw a release of this run (None: every release fits).

    Each release draws an integer noise σ ~ multiplier x (R + 1) x sqrt(changed coordinates),
    which must stay below 2^40 (:func:`grid_gaussian`). Checked with the largest multiplier
    doubled (a guarantee converted by group privacy to the account's relation is stated at half
    the multiplier the sampler draws) and the algorithm's ``release_coordinates_bound``."""
    multipliers = list(gaussian_multipliers(event))
    if not multipliers:
        return None
    largest = 2.0 * max(multipliers)
    try:
        grid_gaussian(1.0, largest, get_algorithm(algorithm).release_coordinates_bound(config, n_items))
    except (ValueError, OverflowError):
        return (f"a release's noise multiplier ({largest / 2:.6g}) is beyond what the exact sampler can draw for "
                f"this run's release sizes (catalogue of {n_items} items): lower the noise ratios or raise epsilon")
    return None
