"""Celery application: Redis broker, no result backend (state lives in the database).

Run: ``celery -A workers.celery_app worker -Q privrec -c 1`` and ``celery -A workers.celery_app beat``.
Both log in the service's one format (:func:`app.logging_setup.configure_logging`, at the level
``--loglevel`` gives); a task's lines carry the id of the API request that sent it. On SIGTERM the
worker stops within seconds: a run in progress stops at its next progress point.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import signal
import threading
from typing import Any

import billiard.process
import billiard.util
from celery import Celery
from celery.signals import (
    celeryd_init,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from app.config import Settings, get_settings
from app.db.session import dispose_engines
from app.logging_setup import REQUEST_ID, configure_logging, redact_task_logs, request_id_from_headers
from app.services.training.dispatch import QUEUE, drain_outbox
from app.services.training.runner import reap_stale_runs, request_shutdown
from app.services.training.schedule import worker_startup

__all__ = ["make_celery", "celery_app", "worker_prefix", "start_maintenance", "log_in_service_format"]

log = logging.getLogger(__name__)


def make_celery(settings: Settings) -> Celery:
    """A configured Celery app for ``settings`` (REDIS_URL must be set)."""
    s = settings
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
        beat_schedule_filename=str(s.beat_schedule_file),
        # a message whose worker vanished comes back after this long (then reaped or skipped)
        broker_transport_options={"visibility_timeout": max(3600, int(4 * s.run_stale_after_s))},
        beat_schedule={
            "privrec-scheduled-retrain": {
                "task": "privrec.scheduled_retrain",
                "schedule": float(s.retrain_tick),  # each data set is retrained at its policy's interval
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


celery_app = make_celery(get_settings())
redact_task_logs()  # no task runtimes or return values in the worker's log


@setup_logging.connect
def log_in_service_format(loglevel: int | str | None = None, logfile: str | None = None, **_: object) -> None:
    """Worker and beat: the service's log format instead of Celery's own (a receiver of this
    signal replaces Celery's logging set-up), at the ``--loglevel`` Celery was given, to stderr
    or the ``--logfile`` given."""
    settings = get_settings()
    stream = open(logfile, "a", encoding="utf-8", buffering=1) if logfile else None  # noqa: SIM115 - the process's log
    configure_logging(loglevel or settings.log_level, settings.log_format, stream)
    pool_logs_in_service_format()


def pool_logs_in_service_format() -> None:
    """billiard's pool logger (its lines such as "Process 'ForkPoolWorker-1' ... exited with 'signal 15
    (SIGTERM)'", when a stop signal reaches the pool's children too) is made not to propagate and has no
    handler, so its lines would reach stderr through logging's last resort, as plain text. Created here
    (billiard sets it up once) and made to propagate to the service's one handler."""
    pool_logger = billiard.util.get_logger()
    pool_logger.handlers[:] = []
    pool_logger.propagate = True


@celeryd_init.connect
def _log_from_the_start(options: dict[str, Any] | None = None, **_: object) -> None:
    """The worker's first lines (its start-up checks' warnings, before Celery sets up logging)
    in the service's format too."""
    given = options or {}
    log_in_service_format(given.get("loglevel"), given.get("logfile"))


_request_tokens: dict[str, contextvars.Token[str | None]] = {}


@task_prerun.connect
def _bind_request_id(task_id: str | None = None, task: Any = None, **_: object) -> None:
    """While a task runs, its log lines carry the id of the request that sent it (if any)."""
    rid = request_id_from_headers(getattr(getattr(task, "request", None), "headers", None))
    if rid is not None and task_id is not None:
        _request_tokens[task_id] = REQUEST_ID.set(rid)


@task_postrun.connect
def _unbind_request_id(task_id: str | None = None, **_: object) -> None:
    token = _request_tokens.pop(task_id or "", None)
    if token is not None:
        REQUEST_ID.reset(token)


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    """Forked pool processes must not reuse the parent's database connections; SIGTERM (Celery
    resets it to the default, an instant death, in its pool processes) stops the run in progress
    at its next progress point instead."""
    dispose_engines()
    signal.signal(signal.SIGTERM, _stop_runs)


def _stop_runs(_signum: int = signal.SIGTERM, _frame: object = None) -> None:
    request_shutdown()


@worker_shutting_down.connect
def _stop_pool_runs(**_: object) -> None:
    """On SIGTERM (or SIGINT / SIGQUIT) the main process stops taking tasks and waits for the pool
    (a warm shutdown): tell each pool process, so a run in progress stops at its next progress
    point (queued again before its private read, failed and charged after) instead of training
    on for as long as it takes. In a solo pool the run is in this process."""
    request_shutdown()
    for child in billiard.process.active_children():
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(child.pid, signal.SIGTERM)


def worker_prefix(hostname: str) -> str:
    """The ``worker`` prefix of runs this Celery node holds (``workers.tasks.train_run``)."""
    return f"celery:{hostname}:"


class _Maintenance:
    """The worker's own reaper and outbox drain, so neither waits for a beat: at start-up it
    fails the runs this node's dead previous incarnation left ``running`` (at once) and any run
    whose heartbeat went stale, and sends queued runs the broker never got; then it repeats the
    stale-run reap and the drain every ``run_heartbeat_s``."""

    def __init__(self, hostname: str, settings: Settings) -> None:
        self.hostname, self.settings = hostname, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="privrec-maintenance", daemon=True)

    def start(self) -> _Maintenance:
        out = worker_startup(worker_prefix(self.hostname), settings=self.settings)
        log.info("worker start-up: reaped runs %s, sent queued runs %s", out["reaped"], out["sent"])
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(max(self.settings.run_heartbeat_s, 1.0)):
            try:
                reap_stale_runs(settings=self.settings)
                drain_outbox(settings=self.settings)
            except Exception:  # noqa: BLE001 - keep maintaining; the next round retries
                log.warning("worker maintenance round failed", exc_info=True)


_maintenance: list[_Maintenance] = []


def start_maintenance(hostname: str, settings: Settings) -> _Maintenance:
    """Run the start-up reap and drain now and keep maintaining in a daemon thread."""
    m = _Maintenance(hostname, settings).start()
    _maintenance.append(m)
    return m


@worker_ready.connect
def _on_worker_ready(sender: object = None, **_: object) -> None:
    start_maintenance(getattr(sender, "hostname", None) or "unknown", get_settings())


@worker_shutdown.connect
def _on_worker_shutdown(**_: object) -> None:
    while _maintenance:
        _maintenance.pop().stop()
