"""Dispatch: hand committed runs to the workers, with the run table as the outbox.

A run whose message never reached the broker keeps ``enqueued_at`` NULL and is sent by
:func:`drain_outbox` (worker start-up, the beat), so reservation and enqueue are one outcome and
a broker outage never invites a second, charged request. In the embedded mode the database is
the queue and :func:`enqueue_run` only wakes the in-process workers registered here.
"""

from __future__ import annotations

import logging
import threading
import weakref
from datetime import timedelta
from typing import Any, Protocol

from app.config import Settings
from app.db.models import as_aware, utcnow
from app.db.session import open_database, session_scope
from app.db.stores.runs import runs_store
from app.logging_setup import request_id_headers

__all__ = ["TASK_NAME", "QUEUE", "REQUEUE_AFTER_S", "BROKER_TIMEOUT_S", "enqueue_run", "drain_outbox",
           "register_waker", "unregister_waker", "wake_workers"]

log = logging.getLogger(__name__)

TASK_NAME = "privrec.train_run"
QUEUE = "privrec"
REQUEUE_AFTER_S = 3600.0  # a queued run sent longer ago than this is re-sent (lost message)
BROKER_TIMEOUT_S = 2.0  # connecting to / publishing on the broker gives up after this long


class Waker(Protocol):
    """An in-process worker that can be woken early (the embedded worker)."""

    def wake(self) -> None: ...


_wakers: weakref.WeakSet[Any] = weakref.WeakSet()


def register_waker(worker: Waker) -> None:
    """Have :func:`enqueue_run` wake ``worker`` (embedded mode)."""
    _wakers.add(worker)


def unregister_waker(worker: Waker) -> None:
    _wakers.discard(worker)


def wake_workers() -> None:
    """Wake every embedded worker of this process (a run was just enqueued)."""
    for worker in list(_wakers):
        worker.wake()


_celery_clients: dict[str, Any] = {}
_celery_lock = threading.Lock()


def _celery_client(broker_url: str) -> Any:
    """A send-only Celery client (the app never imports ``workers``)."""
    # Imported here on purpose: Celery is heavy and the embedded mode (no broker) never needs it.
    from celery import Celery

    with _celery_lock:
        client = _celery_clients.get(broker_url)
        if client is None:
            client = Celery("privrec-client", broker=broker_url)
            client.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
            _celery_clients[broker_url] = client
        return client


def _send(run_id: int, broker_url: str) -> None:
    """Publish the task once, without kombu's retry loop (the outbox retries later); its headers
    carry the current request's id, so the worker's lines for the run name it."""
    client = _celery_client(broker_url)
    with client.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        client.send_task(TASK_NAME, args=[int(run_id)], queue=QUEUE, connection=conn, retry=False,
                         headers=request_id_headers())


def _mark_enqueued(run_id: int, url: str) -> None:
    with session_scope(url) as s:
        runs_store(s).mark_enqueued(run_id)


def enqueue_run(run_id: int, *, settings: Settings, url: str | None = None) -> bool:
    """Hand a committed run to the workers: Celery by task name, or wake the embedded worker.

    Returns True once the message is with the broker (``enqueued_at`` set); False when the broker
    is unreachable: the run stays ``queued`` in the outbox (``enqueued_at`` NULL) and
    :func:`drain_outbox` sends it later. Never raises for a broker fault, so the caller never
    answers 500 after the reservation.
    """
    url = open_database(settings, url)
    if settings.embedded:
        _mark_enqueued(run_id, url)
        wake_workers()
        return True
    try:
        _send(run_id, str(settings.redis_url))
    except Exception as exc:  # noqa: BLE001 - any broker fault leaves the run in the outbox
        log.warning("run %s stays in the outbox: the broker is unreachable (%s)", run_id, type(exc).__name__)
        return False
    _mark_enqueued(run_id, url)
    return True


def drain_outbox(*, settings: Settings, url: str | None = None, older_than_s: float = REQUEUE_AFTER_S) -> list[int]:
    """Send queued runs that never reached the broker (``enqueued_at`` NULL) and re-send those
    sent more than ``older_than_s`` ago (a lost message). Claiming is idempotent, so a duplicate
    is harmless. Returns the ids sent."""
    url = open_database(settings, url)
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with session_scope(url) as s:
        rows = runs_store(s).queued_runs()
    due = [run_id for run_id, sent in rows if sent is None or as_aware(sent) < cutoff]
    return [run_id for run_id in due if enqueue_run(run_id, settings=settings, url=url)]
