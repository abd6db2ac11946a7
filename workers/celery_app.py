"""Celery application: Redis broker, no result backend (state lives in the database).

Run: ``celery -A workers.celery_app worker -Q privrec -c 1`` and ``celery -A workers.celery_app beat``.
"""

from __future__ import annotations

import os
import tempfile

from celery import Celery
from celery.signals import worker_process_init

from app.config import Settings, get_settings
from app.db.session import dispose_engines
from app.services.training import QUEUE

__all__ = ["make_celery", "celery_app"]


def make_celery(settings: Settings | None = None) -> Celery:
    """A configured Celery app for ``settings`` (REDIS_URL must be set)."""
    s = settings or get_settings()
    app = Celery("privrec", broker=s.redis_url, include=["workers.tasks"])
    app.conf.update(
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        result_backend=None,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        enable_utc=True,
        broker_connection_retry_on_startup=True,
        beat_schedule_filename=os.path.join(tempfile.gettempdir(), "privrec-celerybeat-schedule"),
        # a message whose worker vanished comes back after this long (then reaped or skipped)
        broker_transport_options={"visibility_timeout": max(3600, int(4 * s.run_stale_after_s))},
        beat_schedule={
            "privrec-scheduled-retrain": {
                "task": "privrec.scheduled_retrain",
                "schedule": float(s.retrain_interval_s),
                "options": {"queue": QUEUE},
            },
            "privrec-reap-stale-runs": {
                "task": "privrec.reap_stale_runs",
                "schedule": float(max(s.run_heartbeat_s, 5.0)),
                "options": {"queue": QUEUE},
            },
        },
    )
    return app


celery_app = make_celery()


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    """Forked pool processes must not reuse the parent's database connections."""
    dispose_engines()
