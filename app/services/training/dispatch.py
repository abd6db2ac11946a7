"""Dispatch: hand committed runs to the workers, with the run table as the outbox.

A run whose message never reached the broker keeps ``enqueued_at`` NULL and is sent by
:func:`drain_outbox` (worker start-up, its maintenance round every ``run_heartbeat_s``, the beat),
so reservation and enqueue are one outcome and a broker outage never invites a second, charged
request. A queued run sent more than :data:`REQUEUE_AFTER_S` ago whose message the broker no
longer holds (a non-persistent Redis that restarted) is sent again, keyed by run: each message
carries its run id in its task id, and a run whose message still waits in the queue or is
reserved by a worker is not sent twice. The worker's claim is idempotent either way. In the embedded mode the database is
the queue and :func:`enqueue_run` only wakes the in-process workers registered here.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
import weakref
from datetime import timedelta
from typing import Any, Protocol

from app.config import Settings
from app.db.models import as_aware, utcnow
from app.db.session import open_database, session_scope
from app.db.stores.runs import runs_store
from app.logging_setup import request_id_headers

__all__ = ["TASK_NAME", "QUEUE", "REQUEUE_AFTER_S", "BROKER_TIMEOUT_S", "enqueue_run", "drain_outbox",
           "runs_with_broker",
           "register_waker", "unregister_waker", "wake_workers"]

log = logging.getLogger(__name__)

TASK_NAME = "privrec.train_run"
QUEUE = "privrec"
REQUEUE_AFTER_S = 60.0  # a queued run sent longer ago than this, no longer with the broker, is re-sent
BROKER_SCAN_LIMIT = 10_000  # messages of the queue read to find the runs it still holds
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
                         task_id=_task_id(run_id), headers=request_id_headers())


def _task_id(run_id: int) -> str:
    """A fresh task id that names its run (``run-<id>.<uuid>``), read back by :func:`runs_with_broker`."""
    return f"run-{int(run_id)}.{uuid.uuid4().hex}"


def _run_of_message(raw: bytes | str) -> int | None:
    """The run id a raw Redis message (kombu's JSON envelope) names in its task id, if any."""
    try:
        message = json.loads(raw)
        if isinstance(message, list):  # an unacked entry: [message, exchange, routing key]
            message = message[0]
        task_id = str(message["headers"]["id"])
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    head = task_id.split(".", 1)[0]
    return int(head[4:]) if head.startswith("run-") and head[4:].isdigit() else None


def runs_with_broker(broker_url: str) -> set[int] | None:
    """Runs whose message a Redis broker still holds: waiting in the queue or reserved by a
    worker (kombu's ``unacked`` hash). None when that cannot be read (another broker, an outage):
    the caller then re-sends by age alone."""
    if not broker_url.startswith(("redis://", "rediss://")):
        return None
    import redis  # with Celery's Redis transport; imported only where a Redis broker is used

    try:
        client = redis.Redis.from_url(broker_url, socket_timeout=BROKER_TIMEOUT_S,
                                      socket_connect_timeout=BROKER_TIMEOUT_S)
        try:
            raw = [*client.lrange(QUEUE, 0, BROKER_SCAN_LIMIT - 1), *client.hvals("unacked")]
        finally:
            client.close()
    except redis.RedisError:
        return None
    return {run for run in map(_run_of_message, raw) if run is not None}


def _mark_enqueued(run_id: int, url: str) -> None:
    """Record the send; a database fault here is logged, not raised: the message is out, and the
    outbox sending it once more is harmless (the worker's claim is idempotent)."""
    try:
        with session_scope(url) as s:
            runs_store(s).mark_enqueued(run_id)
    except Exception as exc:  # noqa: BLE001 - e.g. a pool timeout under load, after the charge
        log.warning("run %s was sent but not marked enqueued (%s): the outbox re-sends it", run_id, type(exc).__name__)


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
    sent more than ``older_than_s`` ago whose message the broker no longer holds (lost with a
    restarted broker; every one of them when the broker cannot be read). Claiming is idempotent,
    so a duplicate is harmless. Returns the ids sent."""
    url = open_database(settings, url)
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with session_scope(url) as s:
        rows = runs_store(s).queued_runs()
    unsent = [run_id for run_id, sent in rows if sent is None]
    old = [run_id for run_id, sent in rows if sent is not None and as_aware(sent) < cutoff]
    if old and not settings.embedded:
        held = runs_with_broker(str(settings.redis_url)) or set()
        old = [run_id for run_id in old if run_id not in held]
    due = sorted([*unsent, *old])
    return [run_id for run_id in due if enqueue_run(run_id, settings=settings, url=url)]
