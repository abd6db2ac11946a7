"""Training service: request -> reserve budget -> enqueue; run by id -> train -> publish.

The same ``run_training(run_id)`` body runs in a Celery worker (``workers.tasks``) and in the
embedded in-process worker (``app.services.embedded_worker``). State lives in the database:

* ``start_training`` (API / scheduler): computes the run's privacy event from the calibrated
  config *before* any data is read, inserts the run (``queued``) and reserves the event in the
  ledger in the caller's transaction. The caller commits, then calls ``enqueue_run``. The run
  row is the outbox: a run whose message never reached the broker keeps ``enqueued_at`` NULL
  and is sent by :func:`drain_outbox` (worker start-up, the beat), so reservation and enqueue are
  one outcome and a broker outage never invites a second, charged request.
* ``run_training``: claims a ``queued`` run (a finished run is a no-op, so redelivery never
  trains or charges twice; a ``running`` run whose heartbeat went stale was lost by a vanished
  worker and is failed with its reservation counted as spent), checks what it can from public
  facts (the data set's settings, the catalogue size, the reservation), commits
  ``private_data_read`` and only then reads the private data, trains with a fresh secret seed
  and publishes: inserts the model version, commits the ledger reservation and swaps the active
  version in one transaction.

**Once private data has been read, the run is charged, whatever happens.** A failure before
``private_data_read`` (public facts only) refunds the reservation and names its reason; after,
nothing is refunded and the run records a fixed error category, never the exception's text
(a numpy MemoryError names array shapes, i.e. counts). Data-dependent outcomes are not failures:
an empty data set trains a noise-only model, excess voters are dropped at random (one-bit).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app import ledger, model_store
from app.config import Settings, get_settings
from app.core.privacy.accounting import epsilon_pld as _eps_pld
from app.core.privacy.accounting import epsilon_rdp as _eps_rdp
from app.core.algorithms import ALGORITHMS as _ALGORITHMS
from app.core.algorithms import Algorithm, get_algorithm, resolve_hyperparameters
from app.db.models import Dataset, Item, ModelVersion, TrainingRun, utcnow
from app.db.session import is_postgres, session_scope
from app.errors import BudgetExceeded, Conflict, InvalidRequest, NotFound
from app.services.budget import get_dataset
from app.services.training_inputs import load_ratings, load_training_inputs

__all__ = [
    "ALGORITHMS",
    "TASK_NAME",
    "QUEUE",
    "start_training",
    "enqueue_run",
    "submit_training",
    "get_run",
    "list_runs",
    "run_dict",
    "run_training",
    "reap_stale_runs",
    "drain_outbox",
    "worker_startup",
    "scheduled_retrain",
    "public_facts",
    "load_ratings",
    "ERROR_CATEGORIES",
]

log = logging.getLogger(__name__)

TASK_NAME = "privrec.train_run"
QUEUE = "privrec"
ALGORITHMS = tuple(sorted(_ALGORITHMS))
_SECRET_CONFIG_KEYS = ("seed",)  # never stored or published: it would let anyone strip the noise
_ERROR_LIMIT = 2000
REQUEUE_AFTER_S = 3600.0  # a queued run sent longer ago than this is re-sent (lost message)
# What a failed run records once private data was read: a fixed category per exception type,
# never the exception's text (it may carry shapes or values derived from the data).
ERROR_CATEGORIES: tuple[tuple[type[BaseException], str], ...] = (
    (MemoryError, "out_of_memory"),
    (ArithmeticError, "numerical"),
    (ValueError, "rejected_by_algorithm"),
    (OSError, "io"),
    (KeyboardInterrupt, "interrupted"),
    (SystemExit, "interrupted"),
)
_CHARGED_ERROR = ("training failed after reading private data (category: {category}); the run is charged: "
                  "its privacy reservation is spent and never refunded. Details are withheld because they "
                  "could depend on the data.")
MIN_EPSILON = 1e-3  # smaller targets need absurd noise and are refused


# ----------------------------------------------------------------------------- configs
def _base_config(algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None):
    """The (uncalibrated) config: defaults + caller's public hyper-parameters."""
    params = dict(hyperparameters or {})
    for key in _SECRET_CONFIG_KEYS:
        if key in params:
            raise InvalidRequest(f"hyper-parameter {key!r} cannot be chosen: the service draws it secretly per run")
    try:
        return algo.config_from_params(params, (ds.rating_min, ds.rating_max))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"invalid {algo.name} hyper-parameters: {exc}") from exc


def public_facts(session: Session, ds: Dataset) -> dict[str, Any]:
    """What training may know about a data set before reading private data: admin declarations
    and the public catalogue only (kind, the declared bound on its users, rating range, items)."""
    return {"kind": ds.kind, "max_users": ds.max_users, "rating_range": (ds.rating_min, ds.rating_max),
            "n_items": _n_items(session, ds)}


def _data_params(algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None) -> dict[str, Any] | None:
    """Hyper-parameters with what the data set decides for the algorithm's data kind (votes:
    randomisation at ingestion forces ``pre_randomised`` / ``local_epsilon``; ``user_rows``
    defaults to the declared ``max_users``)."""
    if algo.data != "votes":
        return hyperparameters
    from app.services.votes import votes_training_params

    return votes_training_params(ds, hyperparameters)


def _resolved_hyperparameters(
    algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None, objective: str | None,
    epsilon: float, delta: float, n_items: int,
) -> dict[str, Any]:
    """The caller's hyper-parameters, or the ε-aware defaults (public facts only) when none."""
    try:
        params, _ = resolve_hyperparameters(
            algo.name, dict(hyperparameters or {}), objective=objective, epsilon=epsilon, delta=delta,
            rating_range=(ds.rating_min, ds.rating_max), n_items=n_items, max_users=ds.max_users,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    return params


_MIN_ITEMS = {"dpfw": 2, "onebit": 2}  # the catalogue size each algorithm needs (default 1)


def _check_public_shape(algo: Algorithm, config: Any, n_items: int) -> None:
    """Size limits decided from public facts before any data is read (422 otherwise)."""
    need = _MIN_ITEMS.get(algo.name, 1)
    if n_items < need:
        raise InvalidRequest(f"{algo.name} needs at least {need} item(s) in the data set's public catalogue: "
                             "add items first (PUT /v1/datasets/{dataset}/items/{item_id} or privrec import-items)")
    if algo.name != "onebit":
        return
    from app.core.onebit import check_public_shape

    try:
        check_public_shape(config, n_items)
    except ValueError as exc:
        raise InvalidRequest(f"invalid onebit run: {exc}") from exc


def _n_items(session: Session, ds: Dataset) -> int:
    """The public catalogue size (every item of the data set, as training loads them)."""
    return int(session.scalar(select(func.count()).select_from(Item).where(Item.dataset_id == ds.id)) or 0)


# ----------------------------------------------------------------------------- requests
def start_training(
    session: Session,
    *,
    dataset: str,
    algorithm: str = "dpals",
    epsilon: float | None = None,
    epsilon_fraction: float | None = None,
    hyperparameters: dict[str, Any] | None = None,
    objective: str | None = None,
    actor: str,
    trigger: str = "manual",
    idempotency_key: str | None = None,
) -> TrainingRun:
    """Create a queued run and reserve its privacy cost (in the caller's transaction).

    Exactly one of ``epsilon`` (this run's target) or ``epsilon_fraction`` (of the remaining
    budget, in (0, 1]) is given, or neither for a run whose event costs nothing (post-processing:
    ``onebit`` on votes randomised at ingestion, whose guarantee the ledger already holds); it
    is still reserved and committed, with a zero-cost event, so the ledger lists every run.
    Raises InvalidRequest / BudgetExceeded; does not commit. After committing, call
    :func:`enqueue_run` with the run id.
    """
    try:
        algo = get_algorithm(algorithm)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    free_run = epsilon is None and epsilon_fraction is None
    if epsilon is not None and epsilon_fraction is not None:
        raise InvalidRequest("give exactly one of epsilon or epsilon_fraction")
    if epsilon is not None and (
        not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < MIN_EPSILON
    ):
        raise InvalidRequest(f"epsilon must be a finite number >= {MIN_EPSILON}")
    if epsilon_fraction is not None and (
        not isinstance(epsilon_fraction, (int, float)) or not math.isfinite(epsilon_fraction) or not 0 < epsilon_fraction <= 1
    ):
        raise InvalidRequest("epsilon_fraction must lie in (0, 1]")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 128:
        raise InvalidRequest("idempotency_key must have 1 to 128 characters")
    ds = get_dataset(session, dataset)
    acct = ledger.lock_account(session, ds.id)  # serialises requests on this budget
    if idempotency_key is not None:
        existing = session.scalar(
            select(TrainingRun).where(TrainingRun.dataset_id == ds.id, TrainingRun.idempotency_key == idempotency_key)
        )
        if existing is not None:
            return existing
    if epsilon is None and not free_run:
        prior = ledger.spent(session, acct).epsilon_rdp
        # a hair below the fraction: calibration tolerance must not push the total over the cap
        epsilon = epsilon_fraction * (acct.epsilon_cap - prior) * (1 - 1e-6)
        if not epsilon >= MIN_EPSILON:
            raise BudgetExceeded(
                dataset=ds.name,
                prior_spent_epsilon=ledger.round_up(prior),
                requested_epsilon=ledger.round_up(max(epsilon, 0.0)),
                would_spend_epsilon=ledger.round_up(prior + max(epsilon, MIN_EPSILON)),
                epsilon_cap=acct.epsilon_cap,
                delta=acct.delta,
            )
    n_items = _n_items(session, ds)
    if not free_run:
        hyperparameters = _resolved_hyperparameters(algo, ds, hyperparameters, objective, float(epsilon), acct.delta, n_items)
    elif objective is not None:
        raise InvalidRequest(f"{algo.name} has no objective choice")
    base = _base_config(algo, ds, _data_params(algo, ds, hyperparameters))
    if free_run:
        config, epsilon = base, 0.0
    else:
        try:
            config = algo.calibrate(float(epsilon), acct.delta, base, n_items)
        except ValueError as exc:
            raise InvalidRequest(f"cannot calibrate {algo.name} to epsilon {epsilon}: {exc}") from exc
    _check_public_shape(algo, config, n_items)
    event = algo.event(config, n_items)
    if free_run and _eps_rdp(event, acct.delta) != 0.0:
        raise InvalidRequest("give exactly one of epsilon or epsilon_fraction (only a run that costs "
                             "nothing, e.g. onebit on votes randomised at ingestion, may omit both)")
    charged = ledger.event_as_charged(acct, ds, event, algo.event_parameters(config))  # account's relation
    run = TrainingRun(
        dataset_id=ds.id,
        algorithm=algorithm,
        config=algo.public_config(config),
        requested_epsilon=float(epsilon),
        delta=acct.delta,
        epsilon_charged=_eps_rdp(charged, acct.delta),
        status="queued",
        progress=0.0,
        stage="queued",
        trigger=trigger,
        actor=actor,
        idempotency_key=idempotency_key,
        ratings_version=ds.ratings_version,
    )
    session.add(run)
    session.flush()
    ledger.reserve(session, dataset=ds, event=event, parameters=algo.event_parameters(config), actor=actor, run_id=run.id)
    return run


_celery_clients: dict[str, Any] = {}
_celery_lock = threading.Lock()


def _celery_client(broker_url: str):
    """A send-only Celery client (the app never imports ``workers``)."""
    from celery import Celery

    with _celery_lock:
        client = _celery_clients.get(broker_url)
        if client is None:
            client = Celery("privrec-client", broker=broker_url)
            client.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
            _celery_clients[broker_url] = client
        return client


BROKER_TIMEOUT_S = 2.0  # connecting to / publishing on the broker gives up after this long


def _send(run_id: int, broker_url: str) -> None:
    """Publish the task once, without kombu's retry loop (the outbox retries later)."""
    client = _celery_client(broker_url)
    with client.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        client.send_task(TASK_NAME, args=[int(run_id)], queue=QUEUE, connection=conn, retry=False)


def _mark_enqueued(run_id: int, url: str | None) -> None:
    with session_scope(url) as s:
        s.execute(update(TrainingRun).where(TrainingRun.id == run_id).values(enqueued_at=utcnow()))


def enqueue_run(run_id: int, settings: Settings | None = None, *, url: str | None = None) -> bool:
    """Hand a committed run to the workers: Celery by task name, or wake the embedded worker.

    Returns True once the message is with the broker (``enqueued_at`` set); False when the broker
    is unreachable: the run stays ``queued`` in the outbox (``enqueued_at`` NULL) and
    :func:`drain_outbox` sends it later. Never raises for a broker fault, so the caller never
    answers 500 after the reservation.
    """
    s = settings or get_settings()
    url = url or s.database_url
    if s.embedded:
        from app.services.embedded_worker import wake_workers

        _mark_enqueued(run_id, url)
        wake_workers()
        return True
    try:
        _send(run_id, str(s.redis_url))
    except Exception as exc:  # noqa: BLE001 - any broker fault leaves the run in the outbox
        log.warning("run %s stays in the outbox: the broker is unreachable (%s)", run_id, type(exc).__name__)
        return False
    _mark_enqueued(run_id, url)
    return True


def submit_training(*, url: str | None = None, settings: Settings | None = None, **kwargs: Any) -> int:
    """``start_training`` in its own transaction, committed, then enqueued; returns the run id."""
    url = url or (settings or get_settings()).database_url
    with session_scope(url) as session:
        run = start_training(session, **kwargs)
        run_id = run.id
    enqueue_run(run_id, settings, url=url)
    return run_id


def get_run(session: Session, run_id: int, dataset: str | None = None) -> TrainingRun:
    """Training run ``run_id`` (of ``dataset`` when given); NotFound otherwise."""
    run = session.get(TrainingRun, run_id)
    if run is None or (dataset is not None and run.dataset.name != dataset):
        raise NotFound(f"training run {run_id} not found")
    return run


def list_runs(session: Session, dataset: str, *, offset: int = 0, limit: int = 100) -> tuple[list[TrainingRun], int]:
    """One page of runs (newest first) and the total count."""
    if offset < 0 or limit < 1:
        raise InvalidRequest("offset must be >= 0 and limit >= 1")
    ds = get_dataset(session, dataset)
    total = session.scalar(select(func.count()).select_from(TrainingRun).where(TrainingRun.dataset_id == ds.id)) or 0
    rows = list(
        session.scalars(
            select(TrainingRun).where(TrainingRun.dataset_id == ds.id).order_by(TrainingRun.id.desc()).offset(offset).limit(limit)
        )
    )
    return rows, int(total)


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def run_dict(run: TrainingRun) -> dict[str, Any]:
    """JSON-safe view of a run (public config only)."""
    return {
        "id": run.id,
        "dataset": run.dataset.name if run.dataset is not None else None,
        "algorithm": run.algorithm,
        "config": run.config,
        "requested_epsilon": run.requested_epsilon,
        "epsilon_charged": None if run.epsilon_charged is None else ledger.round_up(run.epsilon_charged),
        "delta": run.delta,
        "status": run.status,
        "progress": run.progress,
        "stage": run.stage,
        "error": run.error,
        "trigger": run.trigger,
        "actor": run.actor,
        "refunded": run.refunded,
        "private_data_read": run.private_data_read,
        "enqueued": run.enqueued_at is not None,
        "attempts": run.attempts,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
    }


# ----------------------------------------------------------------------------- running
def _lock_run(session: Session, run_id: int) -> TrainingRun | None:
    stmt = select(TrainingRun).where(TrainingRun.id == run_id)
    if is_postgres(session):
        stmt = stmt.with_for_update()
    return session.execute(stmt.execution_options(populate_existing=True)).scalar_one_or_none()


def _aware(dt):
    from datetime import timezone

    return dt if dt is None or dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def _is_stale(run: TrainingRun, stale_after_s: float) -> bool:
    beat = _aware(run.heartbeat_at or run.started_at)
    return beat is None or utcnow() - beat > timedelta(seconds=stale_after_s)


def error_category(exc: BaseException) -> str:
    """The fixed, data-independent category recorded for a failure after the private read."""
    for kind, category in ERROR_CATEGORIES:
        if isinstance(exc, kind):
            return category
    return "internal"


def _failure_text(exc: BaseException, private_data_read: bool) -> str:
    """A public failure's reason (before the read: public facts only), else the fixed category."""
    if private_data_read:
        return _CHARGED_ERROR.format(category=error_category(exc))
    return f"{type(exc).__name__}: {exc}"


def _fail(session: Session, run: TrainingRun, exc: BaseException, *, actor: str) -> None:
    """Mark ``run`` failed. Refund its reservation only when no private data was read: from
    then on the run is charged whatever happens, and its error is a fixed category."""
    error = _failure_text(exc, run.private_data_read)
    run.status = "failed"
    run.error = error[:_ERROR_LIMIT]
    run.finished_at = utcnow()
    run.stage = "failed"
    if not run.private_data_read:
        entry = ledger.refund(session, dataset=run.dataset, run_id=run.id, actor=actor,
                              reason=f"run failed before reading any private data: {error[:200]}")
        run.refunded = entry is not None
    session.flush()


def _vanished(session: Session, run: TrainingRun) -> None:
    """A worker died mid-run: fail closed, the reservation stays spent."""
    run.status = "failed"
    run.error = "the worker running this training vanished; its privacy reservation is counted as spent"
    run.finished_at = utcnow()
    run.stage = "failed"
    run.private_data_read = True  # unknown whether it read private data: charged, never refund
    session.flush()


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class _Heartbeat:
    """Background thread updating ``heartbeat_at`` of a running run."""

    def __init__(self, run_id: int, url: str | None, interval_s: float) -> None:
        self._run_id, self._url, self._interval = run_id, url, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                with session_scope(self._url) as s:
                    s.execute(
                        update(TrainingRun)
                        .where(TrainingRun.id == self._run_id, TrainingRun.status == "running")
                        .values(heartbeat_at=utcnow())
                    )
            except Exception:  # pragma: no cover - transient DB trouble must not kill training
                log.warning("heartbeat of run %s failed", self._run_id, exc_info=True)


def _progress_writer(run_id: int, url: str | None) -> Callable[[float, str], None]:
    """Callback for the core: writes progress (training spans 0.10..0.90) and stage."""
    last = [0.0]

    def write(fraction: float, stage: str) -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - last[0] < 0.5:
            return
        last[0] = now
        _set_progress(run_id, url, 0.10 + 0.80 * min(max(float(fraction), 0.0), 1.0), f"training: {stage}"[:64])

    return write


def _set_progress(run_id: int, url: str | None, progress: float, stage: str) -> None:
    with session_scope(url) as s:
        s.execute(
            update(TrainingRun)
            .where(TrainingRun.id == run_id, TrainingRun.status == "running")
            .values(progress=progress, stage=stage, heartbeat_at=utcnow())
        )


def _claim(run_id: int, url: str | None, worker: str, stale_after_s: float) -> tuple[str, dict[str, Any] | None]:
    """Move a queued run to running. Returns (outcome, run info) with outcome in
    'claimed' | 'succeeded' | 'failed' | 'busy' | 'missing'."""
    with session_scope(url) as s:
        run = _lock_run(s, run_id)
        if run is None:
            return "missing", None
        if run.status in ("succeeded", "failed"):
            return run.status, None
        if run.status == "running":
            if not _is_stale(run, stale_after_s):
                return "busy", None
            _vanished(s, run)
            return "failed", None
        if ledger.reservation_for(s, run.id) is None:  # cannot happen through start_training
            run.status, run.error, run.finished_at = "failed", "no privacy reservation for this run", utcnow()
            return "failed", None
        run.status = "running"
        run.attempts += 1
        run.worker = worker[:128]
        run.started_at = run.heartbeat_at = utcnow()
        run.stage, run.progress = "checking", 0.02
        return "claimed", {"dataset": run.dataset.name, "config": dict(run.config), "algorithm": run.algorithm}


def run_training(run_id: int, *, url: str | None = None, worker: str | None = None, settings: Settings | None = None) -> str:
    """Execute training run ``run_id`` end to end. Returns the run's outcome:
    'succeeded' | 'failed' | 'busy' (another live worker holds it) | 'missing'."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    outcome, info = _claim(run_id, url, worker or _worker_name(), s_.run_stale_after_s)
    if outcome != "claimed":
        log.info("training run %s not started: %s", run_id, outcome)
        return outcome
    assert info is not None
    try:
        with _Heartbeat(run_id, url, s_.run_heartbeat_s):
            model = _train(run_id, url, info)
            _set_progress(run_id, url, 0.95, "publishing")
            _publish(run_id, url, model, s_)
        return "succeeded"
    except BaseException as exc:  # noqa: BLE001 - every failure must land in the run row
        _record_failure(run_id, url, exc)
        if not isinstance(exc, Exception):
            raise
        return "failed"


def _record_failure(run_id: int, url: str | None, exc: BaseException) -> None:
    """Fail the run (refund only before the private read); log nothing derived from the data."""
    try:
        with session_scope(url) as s:
            run = _lock_run(s, run_id)
            if run is None or run.status != "running":
                return
            read = run.private_data_read
            _fail(s, run, exc, actor="worker")
        if read:
            log.warning("training run %s failed after reading private data (category %s)", run_id, error_category(exc))
        else:
            log.warning("training run %s failed before reading private data: %s: %s", run_id, type(exc).__name__, exc)
    except Exception:  # pragma: no cover
        log.error("could not record the failure of run %s", run_id)


def _public_checks(run_id: int, url: str | None, info: dict[str, Any], algo: Algorithm, config: Any) -> dict[str, Any]:
    """Everything checkable from public facts, before the private read (a failure refunds):
    the data set's vote settings for a free run, the reservation against the config and the
    public catalogue size. Returns the reserved event."""
    from app.core.privacy.accounting import event_to_json

    with session_scope(url) as s:
        ds = get_dataset(s, info["dataset"])
        if info["config"].get("pre_randomised"):
            from app.services.votes import check_pre_randomised_settings

            check_pre_randomised_settings(ds, info["config"].get("local_epsilon"))
        reserved = ledger.reservation_for(s, run_id)
        reserved_event = dict(reserved.event) if reserved else None
        n_items = _n_items(s, ds)
    if reserved_event != event_to_json(algo.event(config, n_items)):
        raise RuntimeError("the run's config no longer matches its privacy reservation")
    return reserved_event


def _read_private(run_id: int, url: str | None, info: dict[str, Any], algo: Algorithm):
    """Commit ``private_data_read`` (the point of no refund), then read the training data.

    A free pre-randomised run locks the data set's vote settings, re-checks them (public) and
    reads only the bits randomised with its ε0 (``load_votes``), so which bits exist never
    decides whether it fails."""
    _mark_private_data_read(run_id, url)
    with session_scope(url) as s:
        ds = get_dataset(s, info["dataset"])
        local_epsilon = info["config"].get("local_epsilon") if info["config"].get("pre_randomised") else None
        if local_epsilon is not None:
            from app.services.votes import lock_pre_randomised

            ds = lock_pre_randomised(s, ds, local_epsilon)
        version = ds.ratings_version
        data, extra_inputs = load_training_inputs(s, ds, algo, local_epsilon=local_epsilon)
        s.execute(update(TrainingRun).where(TrainingRun.id == run_id).values(ratings_version=version))
    return data, extra_inputs


def _train(run_id: int, url: str | None, info: dict[str, Any]):
    from app.core.privacy.accounting import event_to_json

    algo = get_algorithm(info["algorithm"])
    # the secret seed never leaves the worker: models publish their config without it
    config = algo.config_from_dict({**info["config"], "seed": secrets.randbits(63)})
    reserved_event = _public_checks(run_id, url, info, algo, config)
    ratings, extra_inputs = _read_private(run_id, url, info, algo)
    if reserved_event != event_to_json(algo.event(config, ratings.n_items)):  # the catalogue moved
        raise RuntimeError("the run's config no longer matches its privacy reservation")
    _set_progress(run_id, url, 0.10, "training")
    model = algo.train(ratings, config, progress=_progress_writer(run_id, url), **extra_inputs)
    del ratings
    if model.event is None or event_to_json(model.event) != reserved_event:
        raise RuntimeError("the trained model's privacy event differs from the reservation")
    if any(key in model.config for key in _SECRET_CONFIG_KEYS):
        raise RuntimeError("the trained model's config carries a secret")
    return model


def _mark_private_data_read(run_id: int, url: str | None) -> None:
    """Commit the point of no refund before the first private byte is read."""
    with session_scope(url) as s:
        s.execute(
            update(TrainingRun)
            .where(TrainingRun.id == run_id)
            .values(private_data_read=True, stage="reading data", progress=0.05, heartbeat_at=utcnow())
        )


def _publish(run_id: int, url: str | None, model, settings: Settings) -> None:
    with session_scope(url) as s:
        run = s.get(TrainingRun, run_id)
        dataset_name = run.dataset.name
        delta = run.delta
    path = model_store.artifact_path_for(dataset_name, run_id, settings.artifact_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    npz_path, sha = get_algorithm(model.algorithm).save(model, path)  # sha256 covers arrays and metadata
    artifact = str(npz_path)
    eps = _eps_rdp(model.event, delta)
    eps_pld = _eps_pld(model.event, delta)
    metrics = {
        "n_items": model.n_items,
        "n_trained_items": int(np.count_nonzero(model.trained_mask)),  # the DP frequent set
        "rank": model.rank,
        "epsilon_rdp": eps,
        "epsilon_pld": eps_pld,
        "delta": delta,
    }
    with session_scope(url) as s:
        run = _lock_run(s, run_id)
        if run is None or run.status != "running":
            raise Conflict(f"run {run_id} is no longer running; not publishing")
        ds = run.dataset
        ledger.commit(s, dataset=ds, run_id=run_id, actor="worker", parameters={
            "artifact_sha256": sha,
            "released": ["item_factors", "item_counts", "global_mean", "frequent_items", "metrics"],
            "post_processing": "per-user scoring from the published model and the user's own ratings or votes; not charged",
        })
        version = model_store.publish_version(
            s, dataset=ds, run=run, model=model, artifact_path=artifact, sha256=sha,
            epsilon=eps, epsilon_pld=eps_pld, delta=delta, metrics=metrics,
        )
        run.status, run.progress, run.stage, run.finished_at = "succeeded", 1.0, "published", utcnow()
        log.info("run %s published model version %s of %r", run_id, version.id, ds.name)


# ----------------------------------------------------------------------------- maintenance
def reap_stale_runs(*, url: str | None = None, settings: Settings | None = None,
                    dead_worker_prefix: str | None = None) -> list[int]:
    """Fail running runs whose worker vanished (reservation stays spent): a stale heartbeat, or
    (``dead_worker_prefix``, at a worker's start-up) a run held by this worker's dead previous
    incarnation, which is failed at once."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    failed: list[int] = []
    with session_scope(url) as s:
        ids = list(s.scalars(select(TrainingRun.id).where(TrainingRun.status == "running")))
    for run_id in ids:
        with session_scope(url) as s:
            run = _lock_run(s, run_id)
            if run is None or run.status != "running":
                continue
            dead = dead_worker_prefix is not None and (run.worker or "").startswith(dead_worker_prefix)
            if dead or _is_stale(run, s_.run_stale_after_s):
                _vanished(s, run)
                failed.append(run_id)
    if failed:
        log.warning("failed %d training run(s) whose worker vanished", len(failed))
    return failed


def drain_outbox(
    *, url: str | None = None, settings: Settings | None = None, older_than_s: float = REQUEUE_AFTER_S
) -> list[int]:
    """Send queued runs that never reached the broker (``enqueued_at`` NULL) and re-send those
    sent more than ``older_than_s`` ago (a lost message). Claiming is idempotent, so a duplicate
    is harmless. Returns the ids sent."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with session_scope(url) as s:
        rows = s.execute(select(TrainingRun.id, TrainingRun.enqueued_at).where(TrainingRun.status == "queued")
                         .order_by(TrainingRun.id)).all()
    due = [run_id for run_id, sent in rows if sent is None or _aware(sent) < cutoff]
    return [run_id for run_id in due if enqueue_run(run_id, s_, url=url)]


def worker_startup(worker_prefix: str, *, url: str | None = None, settings: Settings | None = None) -> dict[str, list[int]]:
    """What a worker does when it starts: fail the runs its dead previous incarnation (same
    ``worker_prefix``) or any vanished worker left ``running``, then drain the outbox."""
    reaped = reap_stale_runs(url=url, settings=settings, dead_worker_prefix=worker_prefix)
    return {"reaped": reaped, "sent": drain_outbox(url=url, settings=settings)}


def scheduled_retrain(*, url: str | None = None, settings: Settings | None = None, enqueue: bool = True) -> dict[str, str]:
    """Periodic retraining of every data set, decided from public facts only (the schedule, the
    data set's declared kind, its active model, runs in flight and the budget): never from
    whether its data changed or exists. Per data set the outcome is one of 'started:<run id>',
    'skipped:busy', 'skipped:budget', 'skipped:invalid'."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    outcomes: dict[str, str] = {}
    with session_scope(url) as s:
        names = list(s.scalars(select(Dataset.name).order_by(Dataset.id)))
    for name in names:
        outcome, run_id = _retrain_one(name, url, s_)
        outcomes[name] = outcome
        if run_id is not None and enqueue:
            enqueue_run(run_id, s_, url=url)
    return outcomes


_SERVICE_SET_KEYS = ("pre_randomised", "local_epsilon")  # forced by the data set, never passed back
_KIND_ALGORITHMS = {"ratings": "dpals", "votes": "onebit"}  # without an active model


def _retrain_algorithm(session: Session, ds: Dataset) -> tuple[str, dict[str, Any], str | None]:
    """What scheduled retraining runs: the active model's algorithm with its published
    hyper-parameters (re-calibrated to the retrain epsilon), so a DP-CMF or one-bit model is
    not replaced by a DPALS one; without an active model, the default algorithm of the data
    set's declared kind (DPALS for ratings, one-bit for votes), never chosen from the data. A
    model trained on the ε-aware defaults is retrained on the defaults re-derived at the
    retrain's ε (with its objective)."""
    active = session.scalar(select(ModelVersion).where(ModelVersion.dataset_id == ds.id, ModelVersion.active.is_(True)))
    if active is not None:
        run = session.get(TrainingRun, active.run_id)
        if run.config.get("defaults_rule") is not None:  # re-derive the defaults at the retrain's ε
            return active.algorithm, {}, run.config.get("objective")
        return active.algorithm, {k: v for k, v in run.config.items() if k not in _SERVICE_SET_KEYS}, None
    return _KIND_ALGORITHMS[ds.kind], {}, None


def _retrain_one(name: str, url: str | None, settings: Settings) -> tuple[str, int | None]:
    with session_scope(url) as s:
        ds = get_dataset(s, name)
        busy = s.scalar(
            select(func.count()).select_from(TrainingRun).where(
                TrainingRun.dataset_id == ds.id, TrainingRun.status.in_(("queued", "running"))
            )
        )
        if busy:
            return "skipped:busy", None
        algorithm, hyperparameters, objective = _retrain_algorithm(s, ds)
        free = (algorithm == "onebit" and ds.vote_local_epsilon is not None
                and hyperparameters.get("mechanism", "inp") == "inp")  # post-processing of stored bits
        try:
            run = start_training(
                s, dataset=name, algorithm=algorithm, epsilon=None if free else settings.retrain_epsilon,
                hyperparameters=hyperparameters, objective=objective, actor="scheduler", trigger="schedule",
            )
        except BudgetExceeded as exc:
            s.rollback()
            log.info("scheduled retraining of %r skipped: %s", name, exc.message)
            return "skipped:budget", None
        except InvalidRequest as exc:  # e.g. the active model's hyper-parameters no longer apply
            s.rollback()
            log.warning("scheduled retraining of %r skipped: %s", name, exc.message)
            return "skipped:invalid", None
        return f"started:{run.id}", run.id
