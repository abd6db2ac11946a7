"""In-process training worker for the embedded (SQLite, no Redis) mode.

A daemon thread that claims queued runs oldest first and executes them through the same
:func:`app.services.training.runner.run_training` the Celery task calls; it also reaps runs
whose worker vanished and, every ``RETRAIN_INTERVAL_S``, runs the scheduled retraining (the
beat's job). The database is the queue: ``dispatch.enqueue_run`` only wakes the thread early.
Stopping it (the server's shutdown, on SIGTERM) stops a run in progress within a training step.
"""

from __future__ import annotations

import logging
import threading
import time

from app.config import Settings
from app.db.session import open_database, session_scope
from app.db.stores.runs import runs_store
from app.services.training.dispatch import register_waker, unregister_waker
from app.services.training.runner import reap_stale_runs, run_training
from app.services.training.schedule import scheduled_retrain

__all__ = ["EmbeddedWorker", "start_embedded_worker"]

log = logging.getLogger(__name__)

# How long ``stop`` waits for the thread: a run stops at its next progress point (every training
# step), so this only bounds a step that never reports (the thread is a daemon: the process exits).
STOP_WAIT_S = 15.0


class EmbeddedWorker:
    """One background thread running queued trainings one at a time."""

    def __init__(self, settings: Settings, *, url: str | None = None, schedule: bool = True) -> None:
        self.settings = settings
        self.url = open_database(self.settings, url)
        self.schedule = schedule and self.settings.retrain_enabled
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="privrec-embedded-worker", daemon=True)
        self._next_retrain = time.monotonic() + self.settings.retrain_tick
        self._next_reap = 0.0
        self.completed: list[tuple[int, str]] = []

    def start(self) -> EmbeddedWorker:
        register_waker(self)
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float | None = STOP_WAIT_S) -> None:
        """Stop the thread and wait for it: a run in progress stops at its next progress or
        heartbeat point and is failed (refunded only before its private read)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        unregister_waker(self)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _next_queued(self) -> int | None:
        with session_scope(self.url) as s:
            return runs_store(s).oldest_queued_run()

    def run_once(self) -> int | None:
        """Maintenance, then at most one queued run; returns its id (None when idle)."""
        now = time.monotonic()
        if now >= self._next_reap:
            reap_stale_runs(url=self.url, settings=self.settings)
            self._next_reap = now + self.settings.run_heartbeat_s
        if self.schedule and now >= self._next_retrain:
            self._next_retrain = now + self.settings.retrain_tick
            scheduled_retrain(url=self.url, settings=self.settings, enqueue=False)
        run_id = None if self._stop.is_set() else self._next_queued()
        if run_id is None:
            return None
        outcome = run_training(run_id, url=self.url, settings=self.settings, worker=f"embedded:{id(self):x}",
                               stop=self._stop)
        self.completed.append((run_id, outcome))
        return run_id

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ran = self.run_once()
            except Exception:  # keep serving; the failure is in the run row or the log
                log.exception("embedded worker iteration failed")
                ran = None
            if ran is None:
                self._wake.wait(self.settings.embedded_poll_s)
                self._wake.clear()


def start_embedded_worker(settings: Settings, *, url: str | None = None, schedule: bool = True) -> EmbeddedWorker:
    """Start and return the in-process worker (call ``.stop()`` at shutdown)."""
    return EmbeddedWorker(settings, url=url, schedule=schedule).start()
