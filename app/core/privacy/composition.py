"""An account's composed privacy state, kept incrementally, and the one charge computation.

A budget account (a data set's, a person budget's, later a privacy block's) charges a sequence of
events. Recomposing that history on every charge costs time linear in its length; this module
keeps instead a *composed state* that is updated in constant time per event and answers every
question the ledger and the projections ask:

* **RDP curve** on the fixed grid :data:`~app.core.privacy.accounting.RDP_ORDERS`. RDP composes by
  addition at each order (Mironov 2017, arXiv:1702.07476, Prop. 1), so the curve of the history is
  the sum of its events' curves: exact, and the cap check (epsilon at delta, Canonne-Kamath-Steinke
  2020, arXiv:2004.00010, Prop. 12) reads it directly. Every sum and difference is rounded towards
  +inf, so the stored curve is never below the exact sum of the events' curves.
* **PLD normal form** for the tighter report (exact when the normal form is one Gaussian).
  Gaussian releases compose into one Gaussian whose squared inverse noise multiplier is the sum
  of theirs (Dong-Roth-Su 2019, arXiv:1905.02383, Cor. 3.3: mu-GDP composes as
  sqrt(sum mu_i^2), and the PLD of a Gaussian pair is exactly mu-GDP);
  pure-DP pairs (discrete Laplace, binary randomised response) are counted per distinct parameter;
  any other event is counted per distinct event. The PLD accountant composes this normal form, so
  its cost grows with the number of *distinct* event shapes, never with the number of runs.

:func:`charge` is the one place where a new event is converted to an account's neighbouring
relation and checked against its cap; the ledger and the budget projection both call it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from app.core.privacy.accounting import (
    RDP_ORDERS,
    Relation,
    epsilon_gaussian_exact,
    epsilon_of_rdp_curve,
    epsilon_pld,
    event_from_json,
    event_to_json,
    event_under,
    randomized_response_epsilon,
    rdp_curve,
)

__all__ = [
    "GRID_ID",
    "ComposedState",
    "Charge",
    "charge",
    "affordable_runs",
    "event_curve",
]

_MAX_MULTIPLIER = 1e6
#: Fingerprint of the RDP order grid; a stored curve on another grid is recomputed, never read.
GRID_ID = hashlib.sha256(json.dumps(list(RDP_ORDERS)).encode("ascii")).hexdigest()[:16]


def _sum_up(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """``a + b`` rounded towards +inf: the nearest float sum, moved up one float where it fell below
    the exact sum (the rounding error is exact by Knuth's TwoSum, TAOCP vol. 2, 4.2.2, Thm B)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    total = a + b
    with np.errstate(invalid="ignore"):
        b_virtual = total - a
        error = (a - (total - b_virtual)) + (b - b_virtual)
        result: np.ndarray = np.where(error > 0, np.nextafter(total, np.inf), total)
    return result


def _canonical(event_json: Mapping[str, Any]) -> str:
    return json.dumps(event_json, sort_keys=True, separators=(",", ":"))


_MEMO_LIMIT = 4096
_CURVES: dict[str, tuple[float, ...]] = {}


def event_curve(event: dp_event.DpEvent) -> np.ndarray:
    """The RDP curve of ``event`` on :data:`RDP_ORDERS`, memoised per distinct event (keyed by its
    ``repr``, which names every field): a ledger's runs repeat a few shapes, so a replay computes
    each shape's curve once."""
    key = repr(event)
    curve = _CURVES.get(key)
    if curve is None:
        curve = tuple(rdp_curve(event).tolist())
        if len(_CURVES) >= _MEMO_LIMIT:
            _CURVES.clear()
        _CURVES[key] = curve
    return np.array(curve, dtype=float)


@dataclass
class _Shape:
    """An event split into its normal-form parts, with a multiplicity."""

    gaussian_precision: float = 0.0
    pure_pairs: dict[tuple[float, int], int] = field(default_factory=dict)
    others: dict[str, int] = field(default_factory=dict)
    non_private: bool = False


def _shape(event: dp_event.DpEvent, count: int = 1, into: _Shape | None = None) -> _Shape:
    """Flatten ``event`` (self-compositions expanded by multiplicity) into its normal-form parts."""
    out = into if into is not None else _Shape()
    if isinstance(event, dp_event.NoOpDpEvent):
        return out
    if isinstance(event, dp_event.NonPrivateDpEvent):
        out.non_private = True
    elif isinstance(event, dp_event.GaussianDpEvent):
        out.gaussian_precision += count / float(event.noise_multiplier) ** 2
    elif isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            _shape(part, count, out)
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        _shape(event.event, count * int(event.count), out)
    elif isinstance(event, dp_event.RandomizedResponseDpEvent) and event.num_buckets == 2:
        eps = randomized_response_epsilon(event.noise_parameter, event.num_buckets)
        if math.isinf(eps):
            out.non_private = True
        else:
            key = (float(eps), 1)
            out.pure_pairs[key] = out.pure_pairs.get(key, 0) + count
    elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        key = (float(event.noise_parameter), int(event.sensitivity))
        out.pure_pairs[key] = out.pure_pairs.get(key, 0) + count
    else:
        key_json = _canonical(event_to_json(event))
        out.others[key_json] = out.others.get(key_json, 0) + count
    return out


@dataclass(frozen=True)
class ComposedState:
    """The composition of an account's charged events (see the module docstring).

    ``rdp`` is an upper bound of the sum of the events' RDP curves on :data:`RDP_ORDERS`;
    ``gaussian_precision`` of the sum of 1/z^2 over their Gaussian releases; ``pure_pairs`` maps
    (noise parameter a, sensitivity) of discrete-Laplace (pure aΔ-DP) releases to their count;
    ``others`` maps the canonical JSON of any other event to its count; ``labels`` counts the
    charged events by a caller's label (e.g. the relation their guarantee was stated under).
    """

    rdp: tuple[float, ...] = tuple(0.0 for _ in RDP_ORDERS)
    gaussian_precision: float = 0.0
    pure_pairs: tuple[tuple[float, int, int], ...] = ()
    others: tuple[tuple[str, int], ...] = ()
    n_events: int = 0
    labels: tuple[tuple[str, int], ...] = ()
    non_private: int = 0

    # ------------------------------------------------------------------ updates
    def add(self, event: dp_event.DpEvent, label: str | None = None, *,
            curve: np.ndarray | None = None) -> ComposedState:
        """This state with ``event`` (RDP curve ``curve`` when known) composed in: constant time in
        the history's length."""
        return self._moved(event, label, curve=event_curve(event) if curve is None else curve, sign=1)

    def remove(self, event: dp_event.DpEvent, label: str | None = None) -> ComposedState:
        """This state without ``event`` (a refunded reservation): the same event, subtracted."""
        return self._moved(event, label, curve=event_curve(event), sign=-1)

    def plus_curve(self, curve: np.ndarray) -> np.ndarray:
        """The stored curve plus ``curve`` (rounded up)."""
        return _sum_up(np.asarray(self.rdp, dtype=float), curve)

    def _moved(self, event: dp_event.DpEvent, label: str | None, *, curve: np.ndarray, sign: int) -> ComposedState:
        shape = _shape(event)
        rdp = _sum_up(np.asarray(self.rdp, dtype=float), sign * np.asarray(curve, dtype=float))
        if sign < 0:
            rdp = np.maximum(rdp, 0.0)
        precision = float(_sum_up(self.gaussian_precision, sign * shape.gaussian_precision))
        return ComposedState(
            rdp=tuple(rdp.tolist()),
            gaussian_precision=max(precision, 0.0),
            pure_pairs=_merge3(self.pure_pairs, shape.pure_pairs, sign),
            others=_merge(self.others, shape.others, sign),
            n_events=self.n_events + sign,
            labels=self.labels if label is None else _merge(self.labels, {label: 1}, sign),
            non_private=self.non_private + (sign if shape.non_private else 0),
        )

    # ------------------------------------------------------------------ answers
    def epsilon_rdp(self, delta: float) -> float:
        """Epsilon at ``delta`` of the composed history by RDP (inf once a non-private event is in)."""
        if self.non_private:
            return math.inf
        return epsilon_of_rdp_curve(self.rdp, delta) if self.n_events else 0.0

    def pld_event(self, extra: dp_event.DpEvent | None = None) -> dp_event.ComposedDpEvent:
        """The normal form as one event (plus ``extra``), for the PLD accountant."""
        parts: list[dp_event.DpEvent] = []
        if self.gaussian_precision > 0:
            parts.append(dp_event.GaussianDpEvent(self._gaussian_multiplier()))
        for a, d, k in self.pure_pairs:
            parts.append(dp_event.SelfComposedDpEvent(dp_event.DiscreteLaplaceDpEvent(a, d), k))
        for text, k in self.others:
            parts.append(dp_event.SelfComposedDpEvent(event_from_json(json.loads(text)), k))
        if self.non_private:
            parts.append(dp_event.NonPrivateDpEvent())
        if extra is not None:
            parts.append(extra)
        return dp_event.ComposedDpEvent(parts)

    def _gaussian_multiplier(self) -> float:
        """The one Gaussian's multiplier 1/sqrt(sum 1/z^2), rounded down, and at most _MAX_MULTIPLIER
        (less noise: an upper bound on the loss), so that the residue a refund's subtraction may
        leave never reaches the accountant as an overflowing sigma."""
        return min(float(np.nextafter(1.0 / math.sqrt(self.gaussian_precision), 0.0)), _MAX_MULTIPLIER)

    def epsilon_pld(self, delta: float, extra: dp_event.DpEvent | None = None) -> float:
        """Epsilon at ``delta`` of the history (plus ``extra``) from the privacy-loss distribution of
        its normal form: exactly (:func:`epsilon_gaussian_exact`) when that is one Gaussian, else by
        the PLD accountant. Its cost depends on the distinct event shapes, not on the history's length."""
        state = self if extra is None else self.add(extra)
        if state.non_private:
            return math.inf
        if state.pure_pairs or state.others:
            return epsilon_pld(state.pld_event(), delta)
        if state.gaussian_precision <= 0.0:
            return 0.0
        return epsilon_gaussian_exact(state._gaussian_multiplier(), delta)  # pylint: disable=protected-access

    def label_counts(self) -> dict[str, int]:
        """Charged events per label."""
        return dict(self.labels)

    # ------------------------------------------------------------------ storage
    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (floats round-trip exactly through ``repr``)."""
        return {
            "grid": GRID_ID,
            "rdp": [x if math.isfinite(x) else None for x in self.rdp],
            "gaussian_precision": self.gaussian_precision,
            "pure_pairs": [list(p) for p in self.pure_pairs],
            "others": [list(o) for o in self.others],
            "n_events": self.n_events,
            "labels": dict(self.labels),
            "non_private": self.non_private,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> ComposedState | None:
        """The stored state, or ``None`` when absent or on another RDP grid (recompute it)."""
        if not obj or obj.get("grid") != GRID_ID:
            return None
        return cls(
            rdp=tuple(math.inf if x is None else float(x) for x in obj["rdp"]),
            gaussian_precision=float(obj["gaussian_precision"]),
            pure_pairs=tuple((float(a), int(d), int(k)) for a, d, k in obj["pure_pairs"]),
            others=tuple((str(t), int(k)) for t, k in obj["others"]),
            n_events=int(obj["n_events"]),
            labels=tuple(sorted((str(k), int(v)) for k, v in dict(obj["labels"]).items())),
            non_private=int(obj.get("non_private", 0)),
        )

    @classmethod
    def of(cls, events: Iterable[tuple[dp_event.DpEvent, str | None]]) -> ComposedState:
        """The state of ``events`` (event, label) added in order: what a replay of a ledger gives."""
        state = cls()
        for event, label in events:
            state = state.add(event, label)
        return state

    def differences(self, other: ComposedState, *, rel_tol: float = 1e-9) -> list[str]:
        """What differs between two states (the RDP curve and precision within ``rel_tol``)."""
        out = []
        if len(self.rdp) != len(other.rdp) or not all(
                math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12) for a, b in zip(self.rdp, other.rdp, strict=True)):
            out.append("rdp curve")
        if not math.isclose(self.gaussian_precision, other.gaussian_precision, rel_tol=rel_tol, abs_tol=1e-12):
            out.append("gaussian precision")
        for name in ("pure_pairs", "others", "n_events", "labels", "non_private"):
            if getattr(self, name) != getattr(other, name):
                out.append(name.replace("_", " "))
        return out


def _merge(items: tuple[tuple[str, int], ...], delta: Mapping[str, int], sign: int) -> tuple[tuple[str, int], ...]:
    counts = dict(items)
    for key, k in delta.items():
        counts[key] = counts.get(key, 0) + sign * k
    return tuple(sorted((key, k) for key, k in counts.items() if k != 0))


def _counted(items: Iterable[tuple[tuple[float, int], int]]) -> tuple[tuple[float, int, int], ...]:
    return tuple(sorted((a, d, k) for (a, d), k in items if k != 0))


def _merge3(items: tuple[tuple[float, int, int], ...], delta: Mapping[tuple[float, int], int],
            sign: int) -> tuple[tuple[float, int, int], ...]:
    counts = {(a, d): k for a, d, k in items}
    for key, k in delta.items():
        counts[key] = counts.get(key, 0) + sign * k
    return _counted(counts.items())


# ----------------------------------------------------------------------------- the charge
@dataclass(frozen=True)
class Charge:
    """What charging one event to one account does (epsilons by RDP at the account's delta)."""

    event: dp_event.DpEvent  # as charged: converted to the account's relation
    converted: bool  # whether a conversion (group privacy) changed the event
    curve: tuple[float, ...]  # the charged event's RDP curve
    epsilon_alone: float
    epsilon_before: float
    epsilon_after: float
    cap: float
    fits: bool
    state_after: ComposedState


def charge(
    state: ComposedState, event: dp_event.DpEvent, *, guarantee: Relation, account: Relation,
    delta: float, cap: float, label: str | None = None,
) -> Charge:
    """Charge ``event`` (stated under ``guarantee``) to an account under ``account`` whose charged
    history composes to ``state``: convert it (``event_under``; ``ValueError`` when the guarantee
    does not imply the account's relation), compose, and say whether the total stays within ``cap``.

    The one charge computation: the ledger calls it for every account a charge touches, the budget
    projection for the same accounts, on the same stored states.
    """
    charged = event_under(event, guarantee, account)
    curve = event_curve(charged)
    after_curve = state.plus_curve(curve)
    before = state.epsilon_rdp(delta)
    alone = epsilon_of_rdp_curve(curve, delta)
    after = math.inf if state.non_private or _shape(charged).non_private else epsilon_of_rdp_curve(after_curve, delta)
    fits = math.isfinite(after) and after <= cap
    label = label if alone > 0 else None  # only events that cost anything are counted by label
    return Charge(
        event=charged, converted=charged is not event, curve=tuple(curve.tolist()),
        epsilon_alone=alone, epsilon_before=before, epsilon_after=after, cap=float(cap), fits=fits,
        state_after=state.add(charged, label, curve=curve),
    )


def affordable_runs(state: ComposedState, curve: tuple[float, ...] | np.ndarray, *, delta: float, cap: float,
                    limit: int) -> tuple[int, bool]:
    """Largest k <= ``limit`` such that the history plus k runs of RDP curve ``curve`` stays within
    ``cap`` (k runs compose to k times the curve), and whether ``limit`` cut the count."""
    base = np.asarray(state.rdp, dtype=float)
    step = np.asarray(curve, dtype=float)
    if state.non_private:
        return 0, False

    def fits(k: int) -> bool:
        # widened by the rounding k sequential rounded-up sums may add (at most 2 units in the last
        # place each), so that the count never promises a run the ledger's own sums would refuse
        total = _sum_up(base, k * step) * (1.0 + 4.0 * (k + 1) * np.finfo(float).eps)
        return epsilon_of_rdp_curve(total, delta) <= cap

    if not fits(1):
        return 0, False
    if fits(limit):
        return limit, True
    lo, hi = 1, limit  # invariant: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, False
