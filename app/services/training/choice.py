"""What scheduled retraining runs on a data set: decided from public facts only."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.core.algorithms import default_algorithm, get_algorithm
from app.db.models import Dataset, TrainingRun
from app.db.stores.runs import runs_store

__all__ = ["retrain_choice"]


def retrain_choice(session: Session, ds: Dataset) -> tuple[str, dict[str, Any], str | None]:
    """What scheduled retraining runs: the active model's algorithm with its published
    hyper-parameters (re-calibrated to the retrain epsilon), so a DP-CMF or one-bit model is
    not replaced by a DPALS one; without an active model, the default algorithm of the data
    set's declared kind (DPALS for ratings, one-bit for votes), never chosen from the data. A
    model trained on the ε-aware defaults is retrained on the defaults re-derived at the
    retrain's ε (with its objective)."""
    active = runs_store(session).active_version(ds.id)
    if active is not None:
        run = session.get_one(TrainingRun, active.run_id)  # the version's run (foreign key)
        if run.config.get("defaults_rule") is not None:  # re-derive the defaults at the retrain's ε
            return active.algorithm, {}, run.config.get("objective")
        forced = get_algorithm(active.algorithm).service_set_keys  # the data set decides them again
        return active.algorithm, {k: v for k, v in run.config.items() if k not in forced}, None
    return default_algorithm(ds.kind).name, {}, None
