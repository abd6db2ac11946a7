"""Scheduled work: periodic retraining and a worker's start-up maintenance.

Retraining is decided from public facts only (the data set's retrain policy and its latest
scheduled run, its declared kind, its active model, runs in flight and the budget), never from
whether its data changed or exists. A run reads the privacy blocks that can pay for it
(:func:`app.ledger.select_cohorts`), so a new period's block lets retraining go on after older
blocks are spent. Every skip for the budget is a WARNING naming the day the next block opens; so
is a shortage of payable blocks, now or within
:data:`app.services.training.forecast.WARN_INTERVALS` intervals by the forecast.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session

from app.config import Settings
from app.core.algorithms import get_algorithm
from app.db.models import utcnow
from app.db.session import open_database, session_scope
from app.db.stores.runs import runs_store
from app.errors import BudgetExceeded, InvalidRequest, PrivrecError
from app.services.budget import get_dataset, payable_blocks
from app.services.policy import RetrainPolicy, policy_of
from app.services.training.choice import retrain_choice
from app.services.training.dispatch import drain_outbox, enqueue_run
from app.services.training.forecast import forecast, is_due, next_block_opens
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
    """Periodic retraining of every data set at its retrain policy, decided from public facts only
    (the policy and the data set's latest scheduled run, its declared kind, its active model, runs
    in flight and the budget): never from whether its data changed or exists. Per data set the
    outcome is one of 'started:<run id>', 'skipped:busy', 'skipped:not_due' (its interval has not
    elapsed since its latest scheduled run), 'skipped:budget', 'skipped:invalid'. ``now``: the
    clock of this tick (injectable; the real one by default): runs are created at it."""
    s_ = settings
    url = open_database(s_, url)
    now = now or utcnow()
    outcomes: dict[str, str] = {}
    with session_scope(url) as s:
        names = runs_store(s).dataset_names()
    for name in names:
        outcome, run_id = _retrain_one(name, url, s_, now)
        outcomes[name] = outcome
        if run_id is not None and enqueue:
            enqueue_run(run_id, settings=s_, url=url)
    return outcomes


def _retrain_one(name: str, url: str, settings: Settings, now: datetime) -> tuple[str, int | None]:
    with session_scope(url) as s:
        ds = get_dataset(s, name)
        policy = policy_of(ds, settings)
        if runs_store(s).runs_in_flight(ds.id):
            return "skipped:busy", None
        if not is_due(s, ds, policy, now):
            return "skipped:not_due", None
        algorithm, hyperparameters, objective = retrain_choice(s, ds)
        # post-processing of a guarantee the ledger holds (one-bit InP on bits randomised at ingestion)
        free = get_algorithm(algorithm).costs_nothing(hyperparameters, dataset_facts(ds, n_items=0))
        try:
            run = start_training(
                s, dataset=name, algorithm=algorithm, epsilon=None if free else policy.epsilon,
                hyperparameters=hyperparameters, objective=objective, actor="scheduler", trigger="schedule",
                now=now, read_current_block=policy.read_current_block,
            )
        except BudgetExceeded as exc:
            s.rollback()
            _warn_skipped_for_budget(s, name, policy, now, exc.message)
            _warn_ahead(s, name, settings, now)
            return "skipped:budget", None
        except InvalidRequest as exc:  # e.g. the active model's hyper-parameters no longer apply
            s.rollback()
            log.warning("scheduled retraining of %r skipped: %s", name, exc.message)
            return "skipped:invalid", None
        _warn_when_blocks_run_out(s, name, policy, now)
        _warn_ahead(s, name, settings, now)
        return f"started:{run.id}", run.id


def _warn_skipped_for_budget(session: Session, name: str, policy: RetrainPolicy, now: datetime, why: str) -> None:
    """The WARNING of every tick skipped for the budget: why, and when the next block opens."""
    opens = next_block_opens(session, now)
    when = f"the next block ({opens[0]}) opens on {opens[1]:%Y-%m-%d} UTC" if opens else "no block calendar yet"
    log.warning("scheduled retraining of %r skipped: no privacy block can pay a run at epsilon %g (%s); %s",
                name, policy.epsilon, why, when)


def _warn_when_blocks_run_out(session: Session, name: str, policy: RetrainPolicy, now: datetime) -> None:
    """WARNING when fewer blocks than the policy's minimum could pay one more run like this one
    (ledger and calendar facts only)."""
    payable, n_blocks = payable_blocks(session, dataset=name, now=now, read_current=policy.read_current_block)
    if payable < policy.min_payable_blocks:
        log.warning("privacy blocks of %r running out: %d of %d could pay one more scheduled retrain "
                    "(policy minimum %d)", name, payable, n_blocks, policy.min_payable_blocks)


def _warn_ahead(session: Session, name: str, settings: Settings, now: datetime) -> None:
    """The forecast's warnings (a shortage of payable blocks or ``legacy``'s retirement within
    :data:`app.services.training.forecast.WARN_INTERVALS` intervals), each at WARNING."""
    try:
        ahead = forecast(session, dataset=name, settings=settings, now=now)
    except PrivrecError as exc:  # the next run cannot be built (public facts only in the message)
        log.warning("no privacy block forecast for %r: %s", name, exc.message)
        return
    except Exception as exc:  # noqa: BLE001 - a forecast never undoes the tick's run
        log.warning("no privacy block forecast for %r: %s", name, type(exc).__name__)
        return
    for warning in ahead.warnings:
        log.warning("%s", warning)
