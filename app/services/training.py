"""Training service: request -> reserve budget -> enqueue; run by id -> train -> publish.

The same ``run_training(run_id)`` body runs in a Celery worker (``workers.tasks``) and in the
embedded in-process worker (``app.services.embedded_worker``). State lives in the database:

* ``start_training`` (API / scheduler): computes the run's privacy event from the calibrated
  config *before* any data is read, inserts the run (``queued``) and reserves the event in the
  ledger in the caller's transaction. The caller commits, then calls ``enqueue_run``.
* ``run_training``: claims a ``queued`` run (a finished run is a no-op, so redelivery never
  trains or charges twice; a ``running`` run whose heartbeat went stale was lost by a vanished
  worker and is failed with its reservation counted as spent), loads the ratings, trains with a
  fresh secret seed, marks ``output_persisted`` (committed) before writing the artifact, then
  inserts the model version, commits the ledger reservation and swaps the active version in one
  transaction. A failure before ``output_persisted`` refunds the reservation; after, it does not.
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
from app.core.accounting import epsilon_pld as _eps_pld
from app.core.accounting import epsilon_rdp as _eps_rdp
from app.core.algorithms import ALGORITHMS as _ALGORITHMS
from app.core.algorithms import Algorithm, get_algorithm, resolve_hyperparameters
from app.db.models import Dataset, Item, ModelVersion, Rating, TrainingRun, Vote, utcnow
from app.db.session import is_postgres, session_scope
from app.platform_errors import BudgetExceeded, Conflict, InvalidRequest, NotFound
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
    "scheduled_retrain",
    "load_ratings",
]

log = logging.getLogger(__name__)

TASK_NAME = "privrec.train_run"
QUEUE = "privrec"
ALGORITHMS = tuple(sorted(_ALGORITHMS))
_SECRET_CONFIG_KEYS = ("seed",)  # never stored or published: it would let anyone strip the noise
_ERROR_LIMIT = 2000
REQUEUE_AFTER_S = 3600.0  # a queued run older than this is re-sent (lost message)
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


def _data_params(algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None) -> dict[str, Any] | None:
    """Hyper-parameters with what the data set decides for the algorithm's data kind (votes:
    randomisation at ingestion forces ``pre_randomised`` / ``local_epsilon``)."""
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
            rating_range=(ds.rating_min, ds.rating_max), n_items=n_items,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    return params


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
    event = algo.event(config, n_items)
    if free_run and _eps_rdp(event, acct.delta) != 0.0:
        raise InvalidRequest("give exactly one of epsilon or epsilon_fraction (only a run that costs "
                             "nothing, e.g. onebit on votes randomised at ingestion, may omit both)")
    run = TrainingRun(
        dataset_id=ds.id,
        algorithm=algorithm,
        config=algo.public_config(config),
        requested_epsilon=float(epsilon),
        delta=acct.delta,
        epsilon_charged=_eps_rdp(event, acct.delta),
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


def enqueue_run(run_id: int, settings: Settings | None = None) -> None:
    """Hand a committed run to the workers: Celery by task name, or wake the embedded worker."""
    s = settings or get_settings()
    if s.embedded:
        from app.services.embedded_worker import wake_workers

        wake_workers()
        return
    _celery_client(s.redis_url).send_task(TASK_NAME, args=[int(run_id)], queue=QUEUE)


def submit_training(*, url: str | None = None, settings: Settings | None = None, **kwargs: Any) -> int:
    """``start_training`` in its own transaction, committed, then enqueued; returns the run id."""
    url = url or (settings or get_settings()).database_url
    with session_scope(url) as session:
        run = start_training(session, **kwargs)
        run_id = run.id
    enqueue_run(run_id, settings)
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


def _fail(session: Session, run: TrainingRun, error: str, *, actor: str) -> None:
    """Mark ``run`` failed; refund its reservation only when no output was persisted."""
    run.status = "failed"
    run.error = error[:_ERROR_LIMIT]
    run.finished_at = utcnow()
    if not run.output_persisted:
        entry = ledger.refund(session, dataset=run.dataset, run_id=run.id, actor=actor, reason=f"run failed before any output: {error[:200]}")
        run.refunded = entry is not None
    session.flush()


def _vanished(session: Session, run: TrainingRun) -> None:
    """A worker died mid-run: fail closed, the reservation stays spent."""
    run.status = "failed"
    run.error = "the worker running this training vanished; its privacy reservation is counted as spent"
    run.finished_at = utcnow()
    run.output_persisted = True  # unknown what escaped: never refund
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
        run.stage, run.progress = "loading ratings", 0.02
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
            _mark_output_persisted(run_id, url)
            _publish(run_id, url, model, s_)
        return "succeeded"
    except BaseException as exc:  # noqa: BLE001 - every failure must land in the run row
        error = f"{type(exc).__name__}: {exc}"
        log.warning("training run %s failed: %s", run_id, error)
        try:
            with session_scope(url) as s:
                run = _lock_run(s, run_id)
                if run is not None and run.status == "running":
                    _fail(s, run, error, actor="worker")
        except Exception:  # pragma: no cover
            log.exception("could not record the failure of run %s", run_id)
        if not isinstance(exc, Exception):
            raise
        return "failed"


def _train(run_id: int, url: str | None, info: dict[str, Any]):
    from app.core.accounting import event_to_json

    algo = get_algorithm(info["algorithm"])
    with session_scope(url) as s:
        ds = get_dataset(s, info["dataset"])
        if info["config"].get("pre_randomised"):  # a free run must read randomised bits only
            from app.services.votes import check_pre_randomised

            check_pre_randomised(s, ds, info["config"].get("local_epsilon"))
        version = ds.ratings_version
        ratings, extra_inputs = load_training_inputs(s, ds, algo)
        s.execute(update(TrainingRun).where(TrainingRun.id == run_id).values(ratings_version=version))
        reserved = ledger.reservation_for(s, run_id)
        reserved_event = dict(reserved.event) if reserved else None
    # the secret seed never leaves the worker: models publish their config without it
    config = algo.config_from_dict({**info["config"], "seed": secrets.randbits(63)})
    if reserved_event != event_to_json(algo.event(config, ratings.n_items)):
        raise RuntimeError("the run's config no longer matches its privacy reservation")
    _set_progress(run_id, url, 0.10, "training")
    model = algo.train(ratings, config, progress=_progress_writer(run_id, url), **extra_inputs)
    del ratings
    if model.event is None or event_to_json(model.event) != reserved_event:
        raise RuntimeError("the trained model's privacy event differs from the reservation")
    if any(key in model.config for key in _SECRET_CONFIG_KEYS):
        raise RuntimeError("the trained model's config carries a secret")
    return model


def _mark_output_persisted(run_id: int, url: str | None) -> None:
    """Commit the point of no refund before the first byte of output is written."""
    with session_scope(url) as s:
        s.execute(
            update(TrainingRun)
            .where(TrainingRun.id == run_id)
            .values(output_persisted=True, stage="publishing", progress=0.95, heartbeat_at=utcnow())
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
def reap_stale_runs(*, url: str | None = None, settings: Settings | None = None) -> list[int]:
    """Fail running runs whose heartbeat went stale (worker vanished; reservation stays spent)."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    cutoff = utcnow() - timedelta(seconds=s_.run_stale_after_s)
    failed: list[int] = []
    with session_scope(url) as s:
        ids = list(s.scalars(select(TrainingRun.id).where(TrainingRun.status == "running")))
    for run_id in ids:
        with session_scope(url) as s:
            run = _lock_run(s, run_id)
            if run is not None and run.status == "running" and _is_stale(run, s_.run_stale_after_s):
                _vanished(s, run)
                failed.append(run_id)
    if failed:
        log.warning("failed %d training run(s) whose worker vanished (heartbeat before %s)", len(failed), cutoff)
    return failed


def requeue_stale_queued(
    *, url: str | None = None, settings: Settings | None = None, older_than_s: float = REQUEUE_AFTER_S
) -> list[int]:
    """Re-send runs queued (or last re-sent) more than ``older_than_s`` ago: a lost message.
    Claiming is idempotent, so a duplicate is harmless; each run is re-sent at most once per period."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    ids: list[int] = []
    with session_scope(url) as s:
        for run in s.scalars(select(TrainingRun).where(TrainingRun.status == "queued")):
            if _aware(run.heartbeat_at or run.created_at) < cutoff:
                run.heartbeat_at = utcnow()  # for a queued run: when it was last sent
                ids.append(run.id)
    for run_id in ids:
        enqueue_run(run_id, s_)
    return ids


def scheduled_retrain(*, url: str | None = None, settings: Settings | None = None, enqueue: bool = True) -> dict[str, str]:
    """Periodic retraining of every data set. Per data set the outcome is one of
    'started:<run id>', 'skipped:busy', 'skipped:unchanged', 'skipped:no-ratings', 'skipped:budget',
    'skipped:invalid'."""
    s_ = settings or get_settings()
    url = url or s_.database_url
    outcomes: dict[str, str] = {}
    with session_scope(url) as s:
        names = list(s.scalars(select(Dataset.name).order_by(Dataset.id)))
    for name in names:
        outcome, run_id = _retrain_one(name, url, s_)
        outcomes[name] = outcome
        if run_id is not None and enqueue:
            enqueue_run(run_id, s_)
    return outcomes


_SERVICE_SET_KEYS = ("pre_randomised", "local_epsilon")  # forced by the data set, never passed back


def _retrain_algorithm(session: Session, ds: Dataset) -> tuple[str, dict[str, Any], str | None] | None:
    """What scheduled retraining runs: the active model's algorithm with its published
    hyper-parameters (re-calibrated to the retrain epsilon), so a DP-CMF or one-bit model is
    not replaced by a DPALS one; without an active model, DPALS on ratings or one-bit on a
    data set with votes only (defaults). A model trained on the ε-aware defaults is retrained on
    the defaults re-derived at the retrain's ε (with its objective). None when there is no data."""
    active = session.scalar(select(ModelVersion).where(ModelVersion.dataset_id == ds.id, ModelVersion.active.is_(True)))
    if active is not None:
        run = session.get(TrainingRun, active.run_id)
        if run.config.get("defaults_rule") is not None:  # re-derive the defaults at the retrain's ε
            return active.algorithm, {}, run.config.get("objective")
        return active.algorithm, {k: v for k, v in run.config.items() if k not in _SERVICE_SET_KEYS}, None
    if session.scalar(select(Rating.id).where(Rating.dataset_id == ds.id).limit(1)) is not None:
        return "dpals", {}, None
    if session.scalar(select(Vote.id).where(Vote.dataset_id == ds.id).limit(1)) is not None:
        return "onebit", {}, None
    return None


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
        last = s.scalar(select(TrainingRun).where(TrainingRun.dataset_id == ds.id).order_by(TrainingRun.id.desc()).limit(1))
        if last is not None and last.ratings_version >= ds.ratings_version:
            return "skipped:unchanged", None
        choice = _retrain_algorithm(s, ds)
        if choice is None:
            return "skipped:no-ratings", None
        algorithm, hyperparameters, objective = choice
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
