"""A data set's retrain policy: how often the scheduler retrains it, at what epsilon per run, how
many payable privacy blocks are worth training on, and whether scheduled runs read the still-open
current block. Stored with the data set (public, set by the admin); a field it leaves unset takes
the deployment's setting (``RETRAIN_*``)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.config import Settings
from app.db.models import Dataset
from app.errors import InvalidRetrainPolicy
from app.schemas.admin import RETRAIN_EPSILON_BOUNDS, RETRAIN_INTERVAL_BOUNDS, RETRAIN_MIN_BLOCKS_BOUNDS
from app.services.budget import get_dataset

__all__ = ["RetrainPolicy", "POLICY_FIELDS", "policy_of", "get_policy", "set_policy"]

log = logging.getLogger(__name__)

# policy field -> the data set's column
POLICY_FIELDS = {"interval_s": "retrain_interval_s", "epsilon": "retrain_epsilon",
                 "min_payable_blocks": "retrain_min_payable_blocks", "read_current_block": "retrain_read_current_block"}


@dataclass(frozen=True)
class RetrainPolicy:
    """The policy in force for one data set (``defaults``: the fields taken from the deployment)."""

    dataset: str
    interval_s: int
    epsilon: float
    min_payable_blocks: int
    read_current_block: bool
    defaults: list[str] = field(default_factory=list)


def _deployment(settings: Settings) -> dict[str, Any]:
    return {"interval_s": settings.retrain_interval_s, "epsilon": settings.retrain_epsilon,
            "min_payable_blocks": settings.retrain_min_payable_blocks,
            "read_current_block": settings.retrain_read_current_block}


def policy_of(ds: Dataset, settings: Settings) -> RetrainPolicy:
    """The policy in force for ``ds``: its own values, the deployment's where it has none."""
    deployment = _deployment(settings)
    own: dict[str, Any] = {name: getattr(ds, column) for name, column in POLICY_FIELDS.items()}
    values = {name: deployment[name] if own[name] is None else own[name] for name in POLICY_FIELDS}
    return RetrainPolicy(dataset=ds.name, interval_s=int(values["interval_s"]), epsilon=float(values["epsilon"]),
                         min_payable_blocks=int(values["min_payable_blocks"]),
                         read_current_block=bool(values["read_current_block"]),
                         defaults=[name for name in POLICY_FIELDS if own[name] is None])


def get_policy(session: Session, *, dataset: str, settings: Settings) -> RetrainPolicy:
    """The retrain policy in force for the data set ``dataset``."""
    return policy_of(get_dataset(session, dataset), settings)


def _check(interval_s: int | None, epsilon: float | None, min_payable_blocks: int | None) -> None:
    """422 ``invalid_retrain_policy`` for a value out of its bounds (the API's schema checks the same)."""
    if interval_s is not None and not (
            isinstance(interval_s, int) and RETRAIN_INTERVAL_BOUNDS[0] <= interval_s <= RETRAIN_INTERVAL_BOUNDS[1]):
        raise InvalidRetrainPolicy(f"interval_s must be a whole number of seconds in [{RETRAIN_INTERVAL_BOUNDS[0]}, "
                                   f"{RETRAIN_INTERVAL_BOUNDS[1]}]", field="interval_s")
    if epsilon is not None and not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon)
                                    and RETRAIN_EPSILON_BOUNDS[0] <= epsilon <= RETRAIN_EPSILON_BOUNDS[1]):
        raise InvalidRetrainPolicy(f"epsilon must be a finite number in [{RETRAIN_EPSILON_BOUNDS[0]}, "
                                   f"{RETRAIN_EPSILON_BOUNDS[1]:g}]", field="epsilon")
    if min_payable_blocks is not None and not (
            isinstance(min_payable_blocks, int)
            and RETRAIN_MIN_BLOCKS_BOUNDS[0] <= min_payable_blocks <= RETRAIN_MIN_BLOCKS_BOUNDS[1]):
        raise InvalidRetrainPolicy(f"min_payable_blocks must be a whole number in [{RETRAIN_MIN_BLOCKS_BOUNDS[0]}, "
                                   f"{RETRAIN_MIN_BLOCKS_BOUNDS[1]}]", field="min_payable_blocks")


def set_policy(session: Session, *, dataset: str, settings: Settings, actor: str, interval_s: int | None = None,
               epsilon: float | None = None, min_payable_blocks: int | None = None,
               read_current_block: bool | None = None) -> RetrainPolicy:
    """Replace the data set's retrain policy (a value left None takes the deployment's setting); 422
    ``invalid_retrain_policy`` when one is out of its bounds, nothing changed. Does not commit."""
    if isinstance(interval_s, bool) or isinstance(min_payable_blocks, bool):
        raise InvalidRetrainPolicy("interval_s and min_payable_blocks are whole numbers")
    _check(interval_s, epsilon, min_payable_blocks)
    ds = get_dataset(session, dataset)
    values = {"interval_s": interval_s, "epsilon": None if epsilon is None else float(epsilon),
              "min_payable_blocks": min_payable_blocks, "read_current_block": read_current_block}
    for name, column in POLICY_FIELDS.items():
        setattr(ds, column, values[name])
    session.flush()
    log.info("retrain policy of %r set by %s: %s", ds.name, actor, {k: v for k, v in values.items() if v is not None})
    return policy_of(ds, settings)
