"""Privacy accounting on top of ``dp_accounting``: events, epsilon, calibration, JSON.

Every release of every algorithm is described by a ``dp_accounting.DpEvent``; the cost of a run
is always computed by a library accountant (RDP for calibration and the ledger's check, PLD for
the tighter report). Nothing in this module adds epsilons by hand.

Privacy unit: one user with all of their ratings; neighbouring data sets add or remove one user
(``NeighboringRelation.ADD_OR_REMOVE_ONE``).
"""

from __future__ import annotations

import math
from importlib.metadata import version as _package_version
from typing import Any, Callable, Mapping, Sequence

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

__all__ = [
    "NEIGHBOURING_RELATION",
    "DP_ACCOUNTING_VERSION",
    "validate_privacy_target",
    "compose",
    "gaussian",
    "epsilon_rdp",
    "epsilon_pld",
    "calibrate_scale",
    "count_gaussian_releases",
    "event_to_json",
    "event_from_json",
]

NEIGHBOURING_RELATION = "add_or_remove_one_user"
DP_ACCOUNTING_VERSION = _package_version("dp-accounting")

# RDP orders: the library's defaults plus a denser low range and large orders, so that both
# small and large epsilons (up to ~50) are computed tightly.
_RDP_ORDERS: tuple[float, ...] = tuple(
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


def _rdp_accountant() -> rdp_privacy_accountant.RdpAccountant:
    return rdp_privacy_accountant.RdpAccountant(
        orders=list(_RDP_ORDERS),
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )


def _pld_accountant() -> pld_privacy_accountant.PLDAccountant:
    return pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=_PLD_DISCRETISATION,
    )


def epsilon_rdp(event: dp_event.DpEvent, delta: float) -> float:
    """Epsilon of ``event`` at ``delta`` by the RDP accountant (add/remove one user)."""
    validate_privacy_target(1.0, delta)
    return float(_rdp_accountant().compose(event).get_epsilon(delta))


def epsilon_pld(event: dp_event.DpEvent, delta: float) -> float:
    """Epsilon of ``event`` at ``delta`` by the PLD accountant (add/remove one user)."""
    validate_privacy_target(1.0, delta)
    return float(_pld_accountant().compose(event).get_epsilon(delta))


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
        return event.count * count_gaussian_releases(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum(count_gaussian_releases(e) for e in event.events)
    return 0


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
    return _named_tuple_to_json(event.to_named_tuple())


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
