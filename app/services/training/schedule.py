"""Scheduled work: periodic retraining and a worker's start-up maintenance.

Retraining is decided from public facts only (the schedule, the data set's declared kind, its
active model, runs in flight and the budget), never from whether its data changed or exists.
A run reads the privacy blocks that can pay for it (:func:`app.ledger.select_cohorts`), so a new
period's block lets retraining go on after older blocks are spent; when fewer blocks than the
policy's minimum could pay one more run, or none can, the scheduler says so at WARNING.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.config import Settings
from app.core.algorithms import default_algorithm, get_algorithm
from app.db.models import Dataset, TrainingRun
from app.db.session import open_database, session_scope
from app.db.stores.runs import runs_store
from app.errors import BudgetExceeded, InvalidRequest
from app.services.budget import get_dataset, payable_blocks
from app.services.training.dispatch import drain_outbox, enqueue_run
from app.services.training.requests import dataset_facts, start_training
from app.services.training.runner import reap_stale_runs

__all__ = ["scheduled_retrain", "retrain_choice", "worker_startup"]

log = logging.getLogger(__name__)


def worker_startup(worker_prefix: str, *, settings: Settings, url: str | None = None) -> dict[str, list[int]]:
    """What a worker does when it starts: fail the runs its dead previous incarnation (same
    ``worker_prefix``) or any vanished worker left ``running``, then drain the outbox."""
    reaped = reap_stale_runs(url=url, settings=settings, dead_worker_prefix=worker_prefix)
    return {"reaped": reaped, "sent": drain_outbox(url=url, settings=settings)}



def scheduled_retrain(*, settings: Settings, url: str | None = None, enqueue: bool = True,
                      now: datetime | None = None) -> dict[str, str]:
    """Periodic retraining of every data set, decided from public facts only (the schedule, the
    data set's declared kind, its active model, runs in flight and the budget): never from
    whether its data changed or exists. Per data set the outcome is one of 'started:<run id>',
    'skipped:busy', 'skipped:budget', 'skipped:invalid'. ``now``: the clock the blocks are chosen
    at (injectable; the real one by default)."""
    s_ = settings
    url = open_database(s_, url)
    outcomes: dict[str, str] = {}
    with session_scope(url) as s:
        names = runs_store(s).dataset_names()
    for name in names:
        outcome, run_id = _retrain_one(name, url, s_, now)
        outcomes[name] = outcome
        if run_id is not None and enqueue:
            enqueue_run(run_id, settings=s_, url=url)
    return outcomes


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


def _retrain_one(name: str, url: str, settings: Settings, now: datetime | None) -> tuple[str, int | None]:
    with session_scope(url) as s:
        ds = get_dataset(s, name)
        if runs_store(s).runs_in_flight(ds.id):
            return "skipped:busy", None
        algorithm, hyperparameters, objective = retrain_choice(s, ds)
        # post-processing of a guarantee the ledger holds (one-bit InP on bits randomised at ingestion)
        free = get_algorithm(algorithm).costs_nothing(hyperparameters, dataset_facts(ds, n_items=0))
        try:
            run = start_training(
                s, dataset=name, algorithm=algorithm, epsilon=None if free else settings.retrain_epsilon,
                hyperparameters=hyperparameters, objective=objective, actor="scheduler", trigger="schedule",
                now=now,
            )
        except BudgetExceeded as exc:
            s.rollback()
            log.warning("scheduled retraining of %r skipped: no privacy block can pay for it (%s); "
                        "the next period's block opens on the calendar", name, exc.message)
            return "skipped:budget", None
        except InvalidRequest as exc:  # e.g. the active model's hyper-parameters no longer apply
            s.rollback()
            log.warning("scheduled retraining of %r skipped: %s", name, exc.message)
            return "skipped:invalid", None
        _warn_when_blocks_run_out(s, name, settings, now)
        return f"started:{run.id}", run.id


def _warn_when_blocks_run_out(session: Session, name: str, settings: Settings, now: datetime | None) -> None:
    """WARNING when fewer blocks than the policy's minimum could pay one more run like this one
    (ledger and calendar facts only)."""
    payable, n_blocks = payable_blocks(session, dataset=name, now=now)
    if payable < settings.retrain_min_payable_blocks:
        log.warning("privacy blocks of %r running out: %d of %d could pay one more scheduled retrain "
                    "(policy minimum %d)", name, payable, n_blocks, settings.retrain_min_payable_blocks)
