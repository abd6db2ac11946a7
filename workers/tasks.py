"""Thin Celery task shims: ids in, app services do the work (explicit task names)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError

from app.config import get_settings
from app.services.training import runner, schedule
from app.services.training.dispatch import TASK_NAME, drain_outbox
from workers.celery_app import celery_app

log = logging.getLogger(__name__)


@celery_app.task(
    name=TASK_NAME,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=20,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
)
def train_run(self, run_id: int) -> str:
    """Run training run ``run_id``; safe to deliver more than once."""
    settings = get_settings()
    outcome = runner.run_training(int(run_id), settings=settings,
                                  worker=f"celery:{self.request.hostname}:{self.request.id}")
    if outcome == "busy":  # another live worker holds it: look again once its heartbeat could be stale
        raise self.retry(countdown=settings.run_stale_after_s)
    return outcome


@celery_app.task(name="privrec.scheduled_retrain", ignore_result=True)
def scheduled_retrain() -> dict[str, str]:
    """Beat: retrain every data set on schedule, decided from public facts (budget, kind, active model)."""
    outcomes = schedule.scheduled_retrain(settings=get_settings())
    log.info("scheduled retraining: %s", outcomes)
    return outcomes


@celery_app.task(name="privrec.reap_stale_runs", ignore_result=True)
def reap_stale_runs() -> list[int]:
    """Beat: fail runs whose worker vanished, send queued runs the broker never got (outbox) or
    whose message was lost."""
    settings = get_settings()
    failed = runner.reap_stale_runs(settings=settings)
    drain_outbox(settings=settings)
    return failed
