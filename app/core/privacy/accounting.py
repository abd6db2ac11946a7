"""Privacy accounting on top of ``dp_accounting``: events, epsilon, calibration, JSON.

Every release of every algorithm is described by a ``dp_accounting.DpEvent``; the cost of a run
is always computed by a library accountant (RDP for calibration and the ledger's check, PLD for
the tighter report). Nothing in this module adds epsilons by hand.

Privacy unit: one user with all of their ratings; neighbouring data sets add or remove one user
(``NeighboringRelation.ADD_OR_REMOVE_ONE``). :class:`Relation` is the one vocabulary of
neighbouring relations; an event stated under one relation is charged to an account of another
only through :func:`event_under` (implication, or group privacy where it is sound).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import version as _package_version
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

__all__ = [
    "Relation",
    "parse_relation",
    "relation_implies",
    "event_under",
    "NEIGHBOURING_RELATION",
    "DP_ACCOUNTING_VERSION",
    "validate_privacy_target",
    "compose",
    "gaussian",
    "epsilon_rdp",
    "epsilon_pld",
    "epsilon_gaussian_exact",
    "RDP_ORDERS",
    "rdp_curve",
    "epsilon_of_rdp_curve",
    "calibrate_scale",
    "count_gaussian_releases",
    "gaussian_precision",
    "same_gaussian_composition",
    "pure_dp",
    "randomized_response",
    "randomized_response_epsilon",
    "discrete_laplace",
    "discrete_laplace_rdp",
    "event_to_json",
    "event_from_json",
]

class Relation(str, enum.Enum):
    """Neighbouring relations, strongest first. A guarantee under one implies the weaker ones.

    * ``add_or_remove_one_user``: one user and all of their data present or absent (membership,
      ratings, votes: everything is hidden).
    * ``replace_one_user``: the same users, one user's data replaced arbitrarily (the number of
      users is public).
    * ``replace_vote_values``: the same users and the same voted items, the *values* of one
      user's votes changed (randomised response at ingestion: who voted on what is public).
    """

    ADD_OR_REMOVE_ONE_USER = "add_or_remove_one_user"
    REPLACE_ONE_USER = "replace_one_user"
    REPLACE_VOTE_VALUES = "replace_vote_values"


_RELATION_ORDER = (Relation.ADD_OR_REMOVE_ONE_USER, Relation.REPLACE_ONE_USER, Relation.REPLACE_VOTE_VALUES)
# Spellings found in ledgers written before the vocabulary was unified (entries are hash-chained,
# so they are read through this table, never rewritten).
_LEGACY_SPELLINGS = {
    "add_remove_one_user": Relation.ADD_OR_REMOVE_ONE_USER,
    "add_or_remove_one": Relation.ADD_OR_REMOVE_ONE_USER,
    "replace_one_users_votes": Relation.REPLACE_ONE_USER,
    "replace the values of one user's votes (at most votes_per_user_cap of them): which items a "
    "user voted on is NOT hidden by randomised response": Relation.REPLACE_VOTE_VALUES,
}
NEIGHBOURING_RELATION = Relation.ADD_OR_REMOVE_ONE_USER.value
GROUP_PRIVACY_NOTE = (
    "group privacy: replacing one user is removing her and adding another (two add/remove steps); "
    "a Gaussian of multiplier z becomes z/2 (mu-GDP -> 2mu-GDP, Dong-Roth-Su 2019 Thm 2.14), a pure "
    "eps pair becomes a pure 2eps pair"
)


def parse_relation(value: object) -> Relation:
    """The :class:`Relation` named by ``value`` (legacy spellings accepted); ``ValueError`` otherwise."""
    if isinstance(value, Relation):
        return value
    text = str(value)
    try:
        return Relation(text)
    except ValueError:
        if text in _LEGACY_SPELLINGS:
            return _LEGACY_SPELLINGS[text]
    raise ValueError(f"unknown neighbouring relation {text!r}; one of {[r.value for r in Relation]}")


def relation_implies(guarantee: Relation, account: Relation) -> bool:
    """Whether a guarantee under ``guarantee`` bounds the loss under ``account`` (maybe converted)."""
    return _RELATION_ORDER.index(guarantee) <= _RELATION_ORDER.index(account)


def event_under(event: dp_event.DpEvent, guarantee: Relation, account: Relation) -> dp_event.DpEvent:
    """``event`` (stated under ``guarantee``) as an event under ``account``; ``ValueError`` when unsound.

    Weaker relation, same event: a replace-one-user guarantee covers changing vote values (those
    neighbours are replace neighbours). Add/remove to replace: :data:`GROUP_PRIVACY_NOTE`.
    """
    if not relation_implies(guarantee, account):
        raise ValueError(f"a guarantee under {guarantee.value} does not imply {account.value}")
    if guarantee == account or guarantee != Relation.ADD_OR_REMOVE_ONE_USER:
        return event
    return _group_of_two(event)


def _group_of_two(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """An add/remove event's bound for neighbours two add/remove steps apart."""
    if isinstance(event, (dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent)):
        return event
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier / 2.0)
    if isinstance(event, dp_event.RandomizedResponseDpEvent):
        event = _as_pure_pair(event)
        if not isinstance(event, dp_event.DiscreteLaplaceDpEvent):
            return event
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):  # a pure aΔ-DP mechanism -> pure 2aΔ pair
        return pure_dp(2.0 * event.noise_parameter * event.sensitivity)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([_group_of_two(e) for e in event.events])
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(_group_of_two(event.event), event.count)
    raise ValueError(f"no sound group-privacy conversion for {type(event).__name__}")
DP_ACCOUNTING_VERSION = _package_version("dp-accounting")

# RDP orders: the library's defaults plus a denser low range and large orders, so that both
# small and large epsilons (up to ~50) are computed tightly. The grid of every stored RDP curve.
RDP_ORDERS: tuple[float, ...] = tuple(
    sorted(
        set(
            [1.0 + x / 20.0 for x in range(1, 200)]
            + [float(x) for x in range(11, 128)]
            + [128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 1024.0, 2048.0, 4096.0]
        )
    )
)
# PLD grid: 1e-3 in the privacy-loss domain is tight to well below the 1e-3 rounding the
# ledger reports, and keeps composition of ~10 heterogeneous Gaussians fast.
_PLD_DISCRETISATION = 1e-3

_ALLOWED_EVENT_MODULE = dp_event.__name__


def validate_privacy_target(epsilon: float, delta: float) -> None:
    """Raise ``ValueError`` unless ``epsilon > 0`` is finite and ``0 < delta < 1``."""
    if not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not isinstance(delta, (int, float)) or not math.isfinite(delta) or not 0 < delta < 1:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")


def gaussian(noise_multiplier: float) -> dp_event.GaussianDpEvent:
    """A Gaussian release with noise std = ``noise_multiplier`` x its L2 sensitivity."""
    if not math.isfinite(noise_multiplier) or noise_multiplier <= 0:
        raise ValueError(f"noise multiplier must be finite and > 0, got {noise_multiplier!r}")
    return dp_event.GaussianDpEvent(float(noise_multiplier))


def compose(events: Sequence[dp_event.DpEvent]) -> dp_event.DpEvent:
    """Sequential (adaptive) composition of ``events``."""
    return dp_event.ComposedDpEvent(list(events))


# ---------------------------------------------------------------------------- pure-DP events
# The one-bit family (randomized response, discrete Laplace) is pure ε-DP. The library's RDP
# accountant has no discrete Laplace, and both accountants refuse RandomizedResponseDpEvent under
# add/remove. Two facts make them accountable next to the Gaussian events of the other algorithms:
#  * Any pure ε-DP pair of output distributions is a post-processing of the binary
#    randomized-response pair (Kairouz, Oh, Viswanath 2015, Thm 2.4), whose privacy loss is ±ε
#    with P(+ε) = e^ε/(1+e^ε), whatever the neighbouring relation. DiscreteLaplaceDpEvent(ε, 1)
#    has exactly this privacy-loss distribution (loss a(|x−1|−|x|) = ±a, P(x <= 0) = 1/(1+e^−a)),
#    so it is the event of "some ε-DP mechanism" (:func:`pure_dp`), and a binary
#    RandomizedResponseDpEvent is charged as that pair.
#  * The RDP of DLap(a) with integer sensitivity Δ has a closed form (:func:`discrete_laplace_rdp`).
# The relation each run actually protects is stated in its event parameters.
def randomized_response_epsilon(noise_parameter: float, num_buckets: int) -> float:
    """Pure ε of RR over ``num_buckets`` buckets that re-draws uniformly w.p. ``noise_parameter``.

    ε = log((1 − q + q/m)/(q/m)); for m = 2 the flip probability is q/2 and ε = log((1−q/2)/(q/2)).
    """
    q, m = float(noise_parameter), int(num_buckets)
    if not 0 <= q <= 1 or m < 2:
        raise ValueError("randomized response needs 0 <= noise_parameter <= 1 and >= 2 buckets")
    return math.inf if q == 0 else math.log((1.0 - q + q / m) / (q / m))


def randomized_response(epsilon: float) -> dp_event.RandomizedResponseDpEvent:
    """Binary randomized response flipping each bit w.p. p = 1/(1+e^ε) (noise parameter 2p)."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    tail = math.exp(-epsilon)  # 2/(1+e^ε) without overflow (0 for ε > ~745: no noise at all)
    return dp_event.RandomizedResponseDpEvent(noise_parameter=2.0 * tail / (1.0 + tail), num_buckets=2)


def discrete_laplace(noise_parameter: float, sensitivity: int) -> dp_event.DiscreteLaplaceDpEvent:
    """DLap(a) noise (pmf ∝ e^{−a|x|}) on an integer statistic of L1 sensitivity ``sensitivity``."""
    if not math.isfinite(noise_parameter) or noise_parameter <= 0:
        raise ValueError(f"noise parameter must be finite and > 0, got {noise_parameter!r}")
    if not isinstance(sensitivity, int) or sensitivity < 1:
        raise ValueError(f"sensitivity must be an integer >= 1, got {sensitivity!r}")
    return dp_event.DiscreteLaplaceDpEvent(noise_parameter=float(noise_parameter), sensitivity=sensitivity)


def pure_dp(epsilon: float) -> dp_event.DiscreteLaplaceDpEvent:
    """The worst-case pair of an ε-DP mechanism (privacy loss ±ε), see the note above."""
    return discrete_laplace(epsilon, 1)


def discrete_laplace_rdp(noise_parameter: float, sensitivity: int, orders: Sequence[float]) -> list[float]:
    """Exact RDP of DLap(a) with integer sensitivity Δ (symmetric, so one direction suffices).

    P = DLap(a), Q = P shifted by Δ; loss L(x) = a(|x−Δ| − |x|) is aΔ on x <= 0, −aΔ on x >= Δ and
    a(Δ − 2x) in between. With t = α − 1 and pmf tanh(a/2)e^{−a|x|}:
    E_P[e^{tL}] = e^{taΔ}/(1+e^{−a}) + e^{−taΔ}e^{−aΔ}/(1+e^{−a})
                  + tanh(a/2) e^{taΔ} Σ_{x=1}^{Δ−1} e^{−a(1+2t)x}     (a geometric sum),
    and RDP(α) = log(E_P[e^{tL}])/t.
    """
    a, d = float(noise_parameter), int(sensitivity)
    log_norm = -math.log1p(math.exp(-a))  # log 1/(1+e^{-a})
    log_tanh = math.log(math.tanh(a / 2.0))
    out = []
    for order in orders:
        t = float(order) - 1.0
        if t == 0.0:  # KL <= the pure-DP bound aΔ (order 1 is not among the accountant's orders)
            out.append(a * d)
            continue
        r = a * (1.0 + 2.0 * t)  # geometric ratio e^{-r}
        terms = [t * a * d + log_norm, -t * a * d - a * d + log_norm]
        if d > 1:  # Σ_{x=1}^{d-1} e^{-r x} = e^{-r}(1 − e^{-r(d−1)})/(1 − e^{-r})
            terms.append(log_tanh + t * a * d - r + math.log(-math.expm1(-r * (d - 1))) - math.log(-math.expm1(-r)))
        out.append(float(_logsumexp(terms)) / t)
    return out


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


class _RdpAccountant(rdp_privacy_accountant.RdpAccountant):  # type: ignore[misc]  # dp_accounting is untyped
    """The library's RDP accountant plus discrete Laplace and binary RR (as pure-ε pairs)."""

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool) -> Any:
        event = _as_pure_pair(event)
        if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
            if do_compose:
                self._rdp += count * np.asarray(
                    discrete_laplace_rdp(event.noise_parameter, event.sensitivity, self._orders))
            return None
        return super()._maybe_compose(event, count, do_compose)


class _PldAccountant(pld_privacy_accountant.PLDAccountant):  # type: ignore[misc]  # dp_accounting is untyped
    """The library's PLD accountant with binary RR charged as its pure-ε pair (DLap(ε, 1))."""

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool) -> Any:
        return super()._maybe_compose(_as_pure_pair(event), count, do_compose)


def _as_pure_pair(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """A binary-RR event as its pure-ε pair; RR without noise is non-private."""
    if not isinstance(event, dp_event.RandomizedResponseDpEvent):
        return event
    eps = randomized_response_epsilon(event.noise_parameter, event.num_buckets)
    return dp_event.NonPrivateDpEvent() if math.isinf(eps) else pure_dp(eps)


def _rdp_accountant() -> rdp_privacy_accountant.RdpAccountant:
    return _RdpAccountant(
        orders=list(RDP_ORDERS),
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )


def _pld_accountant() -> pld_privacy_accountant.PLDAccountant:
    return _PldAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=_PLD_DISCRETISATION,
    )


def epsilon_rdp(event: dp_event.DpEvent, delta: float) -> float:
    """Epsilon of ``event`` at ``delta`` by the RDP accountant (add/remove one user)."""
    validate_privacy_target(1.0, delta)
    return float(_rdp_accountant().compose(event).get_epsilon(delta))


def rdp_curve(event: dp_event.DpEvent) -> np.ndarray:
    """The RDP of ``event`` at every order of :data:`RDP_ORDERS` (add/remove one user).

    RDP composes by addition at each order (Mironov 2017, arXiv:1702.07476, Prop. 1), so the curve
    of a composition is the sum of its parts' curves.
    """
    accountant = _rdp_accountant()
    accountant.compose(event)
    return np.array(accountant._rdp, dtype=float)  # pylint: disable=protected-access


_ORDERS_ARRAY = np.array(RDP_ORDERS, dtype=float)


def epsilon_of_rdp_curve(curve: Sequence[float] | np.ndarray, delta: float) -> float:
    """Epsilon at ``delta`` of an RDP curve on :data:`RDP_ORDERS`: the conversion the library's RDP
    accountant applies (``rdp_privacy_accountant.compute_epsilon``; Canonne-Kamath-Steinke 2020,
    arXiv:2004.00010, Prop. 12, with its KL shortcut), vectorised over the orders."""
    validate_privacy_target(1.0, delta)
    rdp = np.asarray(curve, dtype=float)
    a = _ORDERS_ARRAY
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bound = rdp + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0)
        eps = np.where(rdp < 0, 0.0, np.where(delta**2 + np.expm1(-rdp) > 0, 0.0, np.where(a > 1.01, bound, np.inf)))
    return float(max(0.0, float(np.min(eps))))


def epsilon_pld(event: dp_event.DpEvent, delta: float) -> float:
    """Epsilon of ``event`` at ``delta`` by the PLD accountant (add/remove one user)."""
    validate_privacy_target(1.0, delta)
    return float(_pld_accountant().compose(event).get_epsilon(delta))


def epsilon_gaussian_exact(noise_multiplier: float, delta: float) -> float:
    """Smallest epsilon (to 1e-12 relative, rounded up) at which one Gaussian release of multiplier
    ``noise_multiplier`` (mu = 1/multiplier) is (epsilon, delta)-DP, from the exact privacy-loss
    distribution of the Gaussian pair: delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)
    (Balle & Wang 2018, arXiv:1805.06530, Thm 8), decreasing in eps, solved by bisection. No
    discretisation, so at most :func:`epsilon_pld` of the same event, and at most :func:`epsilon_rdp`."""
    validate_privacy_target(1.0, delta)
    mu = 1.0 / float(noise_multiplier)

    def delta_at(eps: float) -> float:
        return float(special.ndtr(mu / 2 - eps / mu) - math.exp(eps + special.log_ndtr(-mu / 2 - eps / mu)))

    if delta_at(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, epsilon_rdp(gaussian(noise_multiplier), delta)  # delta_at(lo) > target >= delta_at(hi)
    while hi - lo > 1e-12 * max(hi, 1.0):
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if delta_at(mid) <= delta else (mid, hi)
    return float(hi)


def calibrate_scale(
    make_event: Callable[[float], dp_event.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    lower: float = 1e-3,
    upper: float = 1e4,
) -> float:
    """Smallest scale ``s`` with epsilon(make_event(s), delta) <= target (RDP accountant).

    ``make_event`` must be monotone: a larger ``s`` means more noise. The search itself is
    ``dp_accounting.calibrate_dp_mechanism``; its result is checked before it is returned.
    """
    validate_privacy_target(target_epsilon, delta)
    scale = dp_accounting.calibrate_dp_mechanism(
        _rdp_accountant,
        make_event,
        target_epsilon,
        delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=1e-6,
    )
    achieved = epsilon_rdp(make_event(scale), delta)
    if achieved > target_epsilon * (1 + 1e-9):
        raise ValueError(
            f"calibration failed: scale {scale} gives epsilon {achieved} > target {target_epsilon}"
        )
    return float(scale)


def count_gaussian_releases(event: dp_event.DpEvent) -> int:
    """Number of Gaussian mechanism invocations an event describes (self-compositions expanded)."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return 1
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return int(event.count) * count_gaussian_releases(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum(count_gaussian_releases(e) for e in event.events)
    return 0


def gaussian_precision(event: dp_event.DpEvent) -> float | None:
    """Σ 1/z² over the Gaussian releases an event describes (None: it holds any other event).

    A composition of Gaussian mechanisms of multipliers z_i (sensitivity-normalised) is exactly
    one Gaussian mechanism of multiplier (Σ 1/z_i²)^(-1/2): in μ-GDP, μ² = Σ 1/z_i² (Dong, Roth &
    Su, arXiv 1905.02383, Cor. 3.3), and in RDP each order's ε(α) = α·Σ 1/(2 z_i²) (Mironov,
    arXiv 1702.07476, Prop. 1 and 7). Both compositions hold adaptively."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return 1.0 / float(event.noise_multiplier) ** 2
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = gaussian_precision(event.event)
        return None if inner is None else int(event.count) * inner
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [gaussian_precision(e) for e in event.events]
        return None if any(p is None for p in parts) else math.fsum(p for p in parts if p is not None)
    return None


def same_gaussian_composition(a: dp_event.DpEvent, b: dp_event.DpEvent, rel_tol: float = 1e-9) -> bool:
    """Whether two compositions of Gaussian mechanisms are the same mechanism (equal
    :func:`gaussian_precision`; their RDP curves and privacy loss distributions then coincide)."""
    pa, pb = gaussian_precision(a), gaussian_precision(b)
    return pa is not None and pb is not None and math.isclose(pa, pb, rel_tol=rel_tol)


# ---------------------------------------------------------------------------- JSON round trip
def _named_tuple_to_json(value: Any) -> Any:
    if hasattr(value, "_fields") and hasattr(value, "module_name"):
        return {field: _named_tuple_to_json(getattr(value, field)) for field in value._fields}
    if isinstance(value, (list, tuple)):
        return [_named_tuple_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _named_tuple_to_json(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("events with non-finite parameters cannot be serialised")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot serialise event field of type {type(value).__name__}")


def event_to_json(event: dp_event.DpEvent) -> dict[str, Any]:
    """A JSON-safe dict describing ``event`` (via ``DpEvent.to_named_tuple``)."""
    if not isinstance(event, dp_event.DpEvent):
        raise TypeError(f"expected a DpEvent, got {type(event).__name__}")
    described: dict[str, Any] = _named_tuple_to_json(event.to_named_tuple())
    return described


def _event_class(module_name: Any, class_name: Any) -> type[dp_event.DpEvent]:
    if module_name != _ALLOWED_EVENT_MODULE:
        raise ValueError(f"refusing to load an event from module {module_name!r}")
    cls = getattr(dp_event, str(class_name), None)
    if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)) or cls is dp_event.DpEvent:
        raise ValueError(f"unknown dp_accounting event class {class_name!r}")
    return cls


def _json_value_to_event_field(value: Any) -> Any:
    if isinstance(value, dict) and "class_name" in value:
        return event_from_json(value)
    if isinstance(value, list):
        return [_json_value_to_event_field(v) for v in value]
    return value


def event_from_json(obj: Mapping[str, Any]) -> dp_event.DpEvent:
    """Rebuild an event from :func:`event_to_json` output.

    Only concrete classes of ``dp_accounting.dp_event`` are accepted; anything else (another
    module, an unknown class, extra or missing fields) raises ``ValueError``.
    """
    if not isinstance(obj, Mapping):
        raise ValueError("an event must be a JSON object")
    cls = _event_class(obj.get("module_name"), obj.get("class_name"))
    fields = {k: v for k, v in obj.items() if k not in ("module_name", "class_name")}
    try:
        return cls(**{k: _json_value_to_event_field(v) for k, v in fields.items()})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed {cls.__name__}: {exc}") from exc
