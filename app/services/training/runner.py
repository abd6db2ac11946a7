"""Training runner: run by id -> claim -> public checks -> private read -> train -> publish.

The same :func:`run_training` body runs in a Celery worker (``workers.tasks``) and in the
embedded in-process worker (:mod:`app.services.training.embedded_worker`). State lives in the
database: it claims a ``queued`` run (a finished run is a no-op, so redelivery never trains or
charges twice; a ``running`` run whose heartbeat went stale was lost by a vanished worker and is
failed with its reservation counted as spent), checks what it can from public facts (the data
set's settings, the catalogue size, the reservation), commits ``private_data_read`` and only
then reads the private data, trains with a fresh secret seed and publishes: inserts the model
version, commits the ledger reservation and swaps the active version in one transaction.

**Once private data has been read, the run is charged, whatever happens.** A failure before
``private_data_read`` (public facts only) refunds the reservation and names its reason; after,
nothing is refunded and the run records a fixed error category, never the exception's text
(a numpy MemoryError names array shapes, i.e. counts). Data-dependent outcomes are not failures:
an empty data set trains a noise-only model, excess voters are dropped at random (one-bit).
The released outputs of a run are those its algorithm names (``app.core.algorithms``).

**Stopping.** Every progress point and the heartbeat check that the run is still ``running``
(an admin may cancel it: ``app.services.training.cancel``) and that the process is not shutting
down (:func:`request_shutdown`, on SIGTERM); either stops the training, which then publishes
nothing. A cancelled run's row already says what it costs; a run stopped by a shutdown goes back
to the queue if it read nothing, and is failed (charged) otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app import ledger, model_store
from app.config import Settings
from app.core.algorithms import Algorithm, get_algorithm
from app.core.mf.artifact import ArtifactError
from app.core.privacy.accounting import epsilon_pld as _eps_pld
from app.core.privacy.accounting import epsilon_rdp as _eps_rdp
from app.core.privacy.accounting import event_to_json
from app.core.utility import utility_indicator
from app.db.loaders import load_training_inputs
from app.db.models import TrainingRun, as_aware, utcnow
from app.db.session import open_database, ride_out_outage, session_scope
from app.db.stores.runs import runs_store
from app.errors import NoActiveModel, RunNotRunning
from app.services.budget import get_dataset
from app.services.training import cluster
from app.services.training.requests import SECRET_CONFIG_KEYS, n_items_of
from app.services.votes import check_pre_randomised_settings, lock_pre_randomised

__all__ = [
    "ERROR_CATEGORIES",
    "error_category",
    "run_training",
    "reap_stale_runs",
    "lock_run",
    "is_stale",
    "fail_vanished",
    "WorkerShutdown",
    "request_shutdown",
    "shutdown_requested",
    "clear_shutdown",
]

log = logging.getLogger(__name__)

_ERROR_LIMIT = 2000


class WorkerShutdown(Exception):
    """The process is stopping (SIGTERM): the run stops at its next progress or heartbeat point."""


# Set when the process is asked to stop (``serve``'s shutdown, a Celery worker's SIGTERM): every
# run of the process stops at its next progress or heartbeat point instead of training on.
_SHUTDOWN = threading.Event()


def request_shutdown() -> None:
    """Make every run of this process stop at its next progress or heartbeat point (queued again
    before its private read, failed and charged after it)."""
    _SHUTDOWN.set()


def shutdown_requested() -> bool:
    return _SHUTDOWN.is_set()


def clear_shutdown() -> None:
    """Let runs start again in this process (a new server in the same process: tests)."""
    _SHUTDOWN.clear()

# What a failed run records once private data was read: a fixed category per exception type,
# never the exception's text (it may carry shapes or values derived from the data).
ERROR_CATEGORIES: tuple[tuple[type[BaseException], str], ...] = (
    (MemoryError, "out_of_memory"),
    (ArithmeticError, "numerical"),
    (ValueError, "rejected_by_algorithm"),
    (OSError, "io"),
    (KeyboardInterrupt, "interrupted"),
    (WorkerShutdown, "interrupted"),
    (SystemExit, "interrupted"),
)
_CHARGED_ERROR = ("training failed after reading private data (category: {category}); the run is charged: "
                  "its privacy reservation is spent and never refunded. Details are withheld because they "
                  "could depend on the data.")


def lock_run(session: Session, run_id: int) -> TrainingRun | None:
    """Run ``run_id`` read afresh and row-locked until the transaction ends (None when absent)."""
    return runs_store(session).lock_run(run_id)


def is_stale(run: TrainingRun, stale_after_s: float) -> bool:
    beat = as_aware(run.heartbeat_at or run.started_at)
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


def _requeue(run: TrainingRun) -> None:
    """Put a run that read nothing back in the outbox (queued, never sent)."""
    run.status, run.stage, run.progress = "queued", "queued", 0.0
    run.worker = run.started_at = run.heartbeat_at = run.enqueued_at = None


def fail_vanished(session: Session, run: TrainingRun) -> None:
    """A worker died mid-run: fail closed, the reservation stays spent."""
    run.status = "failed"
    run.error = "the worker running this training vanished; its privacy reservation is counted as spent"
    run.finished_at = utcnow()
    run.stage = "failed"
    run.private_data_read = True  # unknown whether it read private data: charged, never refund
    session.flush()


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class _Guard:
    """Whether run ``run_id`` may go on: it stops (raises) once the run is no longer ``running``
    in the database (cancelled, or failed by the reaper) or the process is shutting down. Checked
    at every progress point; the heartbeat and the progress writes notice the first."""

    def __init__(self, run_id: int, stop: threading.Event) -> None:
        self.run_id, self.stop = run_id, stop
        self.gone = threading.Event()

    def check(self) -> None:
        if self.gone.is_set():
            raise RunNotRunning(f"run {self.run_id} is no longer running (cancelled or reaped); not publishing")
        if self.stop.is_set():
            raise WorkerShutdown(f"the worker is stopping; run {self.run_id} stops")

    def running(self, still_running: bool) -> None:
        """Record what a conditional write of the run found, then :meth:`check`."""
        if not still_running:
            self.gone.set()
        self.check()


class _Heartbeat:
    """Background thread updating ``heartbeat_at`` of a running run (and noting, on its guard,
    when the run is no longer running)."""

    def __init__(self, run_id: int, url: str, interval_s: float, guard: _Guard) -> None:
        self._run_id, self._url, self._interval, self._guard = run_id, url, interval_s, guard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                with session_scope(self._url) as s:
                    if not runs_store(s).set_heartbeat(self._run_id):
                        self._guard.gone.set()
            except Exception:  # pragma: no cover - transient DB trouble must not kill training
                log.warning("heartbeat of run %s failed", self._run_id, exc_info=True)


def _progress_writer(run_id: int, url: str, guard: _Guard) -> Callable[[float, str], None]:
    """Callback for the core: writes progress (training spans 0.10..0.90) and stage, and stops
    the training (raises) once the run was cancelled or the process is shutting down."""
    last = [0.0]

    def write(fraction: float, stage: str) -> None:
        guard.check()
        now = time.monotonic()
        if fraction < 1.0 and now - last[0] < 0.5:
            return
        last[0] = now
        try:
            running = _set_progress(run_id, url, 0.10 + 0.80 * min(max(float(fraction), 0.0), 1.0),
                                    f"training: {stage}"[:64])
        except Exception as exc:  # noqa: BLE001 - progress is best effort: a database outage must not fail training
            log.warning("progress of run %s not written (%s)", run_id, type(exc).__name__)
            return
        guard.running(running)

    return write


def _set_progress(run_id: int, url: str, progress: float, stage: str) -> bool:
    """Write progress; False when the run is no longer running."""
    with session_scope(url) as s:
        return runs_store(s).set_progress(run_id, progress, stage)


def _claim(run_id: int, url: str, worker: str, stale_after_s: float) -> tuple[str, dict[str, Any] | None]:
    """Move a queued run to running. Returns (outcome, run info) with outcome in
    'claimed' | 'succeeded' | 'failed' | 'busy' | 'missing'."""
    with session_scope(url) as s:
        run = lock_run(s, run_id)
        if run is None:
            return "missing", None
        if run.status in ("succeeded", "failed"):
            return run.status, None
        if run.status == "running":
            if not is_stale(run, stale_after_s):
                return "busy", None
            fail_vanished(s, run)
            return "failed", None
        if ledger.reservation_for(s, run.id) is None:  # cannot happen through start_training
            run.status, run.error, run.finished_at = "failed", "no privacy reservation for this run", utcnow()
            return "failed", None
        run.status = "running"
        run.attempts += 1
        run.worker = worker[:128]
        run.started_at = run.heartbeat_at = utcnow()
        run.stage, run.progress = "checking", 0.02
        return "claimed", {"dataset": run.dataset.name, "config": dict(run.config), "algorithm": run.algorithm,
                        "cohorts": run.cohorts}


def run_training(run_id: int, *, settings: Settings, url: str | None = None, worker: str | None = None,
                 stop: threading.Event | None = None) -> str:
    """Execute training run ``run_id`` end to end. Returns the run's outcome:
    'succeeded' | 'failed' | 'busy' (another live worker holds it) | 'missing' | 'cancelled'
    (cancelled while it ran: stopped at a progress or heartbeat point, nothing published) |
    'interrupted' (``stop``, by default the process's :func:`request_shutdown`, was set: stopped
    the same way; queued again before the private read, failed and charged after it)."""
    s_ = settings
    url = open_database(s_, url)
    outcome, info = _claim(run_id, url, worker or _worker_name(), s_.run_stale_after_s)
    if outcome != "claimed":
        log.info("training run %s not started: %s", run_id, outcome)
        return outcome
    assert info is not None
    # a database outage shorter than the reaper's patience is ridden out, not a failed run
    outage_s = s_.run_stale_after_s
    guard = _Guard(run_id, stop if stop is not None else _SHUTDOWN)
    try:
        with _Heartbeat(run_id, url, s_.run_heartbeat_s, guard):
            model, kept_from = _train(run_id, url, info, outage_s, guard, s_)
            guard.running(ride_out_outage(lambda: _set_progress(run_id, url, 0.95, "publishing"), within_s=outage_s))
            ride_out_outage(lambda: _publish(run_id, url, model, s_, kept_from), within_s=outage_s)
        return "succeeded"
    except RunNotRunning:  # cancelled (or reaped) meanwhile: its row already says so
        log.info("training run %s stopped without publishing: it is no longer running", run_id)
        return "cancelled"
    except BaseException as exc:  # noqa: BLE001 - every failure must land in the run row
        _record_failure(run_id, url, exc, outage_s)
        if not isinstance(exc, Exception):
            raise
        return "interrupted" if isinstance(exc, WorkerShutdown) else "failed"


def _record_failure(run_id: int, url: str, exc: BaseException, outage_s: float = 0.0) -> None:
    """Fail the run (refund only before the private read), riding out a database outage of up
    to ``outage_s``; log nothing derived from the data. A run stopped by its worker's shutdown
    before its private read goes back to the queue instead (reservation kept; the outbox sends it)."""

    def fail() -> bool | None:
        with session_scope(url) as s:
            run = lock_run(s, run_id)
            if run is None or run.status != "running":
                return None
            read = run.private_data_read
            if isinstance(exc, WorkerShutdown) and not read:
                _requeue(run)
                log.info("training run %s goes back to the queue: its worker stopped before reading data", run_id)
                return None
            _fail(s, run, exc, actor="worker")
            return read

    try:
        read = ride_out_outage(fail, within_s=outage_s)
        if read is None:
            return
        if read:
            log.warning("training run %s failed after reading private data (category %s)", run_id, error_category(exc))
        else:
            log.warning("training run %s failed before reading private data: %s: %s", run_id, type(exc).__name__, exc)
    except Exception:  # pragma: no cover
        log.error("could not record the failure of run %s", run_id)


def _public_checks(run_id: int, url: str, info: dict[str, Any], algo: Algorithm, config: Any) -> dict[str, Any]:
    """Everything checkable from public facts, before the private read (a failure refunds):
    the data set's vote settings for a free run, the reservation against the config and the
    public catalogue size. Returns the reserved event."""
    with session_scope(url) as s:
        ds = get_dataset(s, info["dataset"])
        local_epsilon = algo.pre_randomised_epsilon(info["config"])
        if local_epsilon is not None:
            check_pre_randomised_settings(ds, local_epsilon)
        reserved = ledger.reservation_for(s, run_id)
        reserved_event = None if reserved is None or reserved.event is None else dict(reserved.event)
        n_items = n_items_of(s, ds)
    if reserved_event != event_to_json(algo.event(config, n_items)):
        raise RuntimeError("the run's config no longer matches its privacy reservation")
    return reserved_event


def _read_private(run_id: int, url: str, info: dict[str, Any], algo: Algorithm):
    """Read the training data (after ``private_data_read`` was committed: the point of no refund).

    A free pre-randomised run locks the data set's vote settings, re-checks them (public) and
    reads only the bits randomised with its ε0 (:func:`app.db.loaders.load_votes`), so which bits exist never
    decides whether it fails. (The caller commits ``private_data_read`` first.)"""
    with session_scope(url) as s:
        ds = get_dataset(s, info["dataset"])
        local_epsilon = algo.pre_randomised_epsilon(info["config"])
        if local_epsilon is not None:
            ds = lock_pre_randomised(s, ds, local_epsilon)
        version = ds.ratings_version
        data, extra_inputs = load_training_inputs(s, ds, algo, local_epsilon=local_epsilon,
                                                   cohorts=info.get("cohorts"))
        runs_store(s).set_ratings_version(run_id, version)
    return data, extra_inputs


def _train(run_id: int, url: str, info: dict[str, Any], outage_s: float, guard: _Guard,
           settings: Settings) -> tuple[Any, int | None]:
    """Public checks, the private read and training; each database step rides out an outage of
    up to ``outage_s`` (:func:`ride_out_outage`); ``guard`` stops it between steps and at every
    progress point. With ``DASK_SCHEDULER_ADDRESS`` set, DPALS and DP-CMF train on the cluster
    (:mod:`app.services.training.cluster`), connected to before the private read. Returns the
    model and the model version it took inputs from (rule 11's kept items), or None."""
    algo = get_algorithm(info["algorithm"])
    # the secret seed never leaves the worker: models publish their config without it
    config = algo.config_from_dict({**info["config"], "seed": secrets.randbits(128)})
    reserved_event = ride_out_outage(lambda: _public_checks(run_id, url, info, algo, config), within_s=outage_s)
    source: dict[str, int] = {}
    in_force = ride_out_outage(lambda: algo.inputs_from_model_in_force(config, lambda: _model_in_force(url, info, source)),
                               within_s=outage_s)  # public: read before the private data
    kept_from = source.get("version") if in_force else None
    on_cluster = cluster.uses_cluster(settings, algo)
    if on_cluster:
        cluster.check_cluster_database(url)
    with cluster.cluster_client(settings) if on_cluster else contextlib.nullcontext() as client:
        guard.check()
        guard.running(ride_out_outage(lambda: _mark_private_data_read(run_id, url), within_s=outage_s))

        def start_training(n_items: int) -> Callable[[float, str], None]:
            if reserved_event != event_to_json(algo.event(config, n_items)):  # the catalogue moved
                raise RuntimeError("the run's config no longer matches its privacy reservation")
            guard.running(ride_out_outage(lambda: _set_progress(run_id, url, 0.10, "training"), within_s=outage_s))
            return _progress_writer(run_id, url, guard)

        if client is None:
            ratings, extra_inputs = ride_out_outage(lambda: _read_private(run_id, url, info, algo), within_s=outage_s)
            model = algo.train(ratings, config, progress=start_training(ratings.n_items), **extra_inputs, **in_force)
            del ratings
        else:  # the partitions are read on the cluster's workers, in one snapshot of the database
            with contextlib.ExitStack() as snapshot:
                data, extra = ride_out_outage(lambda: snapshot.enter_context(cluster.partitioned_read(
                    client, settings, url, info["dataset"], algo, info.get("cohorts"),
                    lambda version: _set_ratings_version(run_id, url, version))), within_s=outage_s)
                model = cluster.train_on_cluster(client, algo, data, config, settings,
                                                 progress=start_training(data.n_items), **extra, **in_force)
    if model.event is None or event_to_json(model.event) != reserved_event:
        raise RuntimeError("the trained model's privacy event differs from the reservation")
    if any(key in model.config for key in SECRET_CONFIG_KEYS):
        raise RuntimeError("the trained model's config carries a secret")
    return model, kept_from


def _model_in_force(url: str, info: dict[str, Any], source: dict[str, int]) -> Any:
    """The data set's active published model (public), or None when there is none; its version id
    goes into ``source["version"]``."""
    with session_scope(url) as s:
        try:
            row, model = model_store.get_active_model(s, info["dataset"])
            source["version"] = row.id
            return model
        except NoActiveModel:
            return None
        except ArtifactError as exc:  # the run goes on without it: a missing file is no reason to stop learning
            log.warning("the model in force could not be read (%s): the run keeps none of its items", type(exc).__name__)
            return None


def _set_ratings_version(run_id: int, url: str, version: int) -> None:
    """Record the data set's version the run read (a cluster run's snapshot is read only)."""
    with session_scope(url) as s:
        runs_store(s).set_ratings_version(run_id, version)


def _mark_private_data_read(run_id: int, url: str) -> bool:
    """Commit the point of no refund before the first private byte is read; False (nothing
    written, nothing to be read) when the run is no longer running (cancelled)."""
    with session_scope(url) as s:
        return runs_store(s).mark_private_data_read(run_id)


def _publish(run_id: int, url: str, model, settings: Settings, kept_from: int | None = None) -> None:
    with session_scope(url) as s:
        requested = s.get_one(TrainingRun, run_id)
        dataset_name = requested.dataset.name
        delta = requested.delta
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
        **_utility(model),
        # rule 11: the published version whose trained items this run kept (public), when it kept any
        **({} if kept_from is None else {"kept_items_from_version": kept_from}),
    }
    with session_scope(url) as s:
        run = lock_run(s, run_id)
        if run is None or run.status != "running":
            raise RunNotRunning(f"run {run_id} is no longer running; not publishing")
        ds = run.dataset
        ledger.commit(s, dataset=ds, run_id=run_id, actor="worker", parameters={
            "artifact_sha256": sha,
            "released": [*get_algorithm(model.algorithm).released_outputs, "metrics"],
            "post_processing": "per-user scoring from the published model and the user's own ratings or votes; not charged",
        })
        version = model_store.publish_version(
            s, dataset=ds, run=run, model=model, artifact_path=artifact, sha256=sha,
            epsilon=eps, epsilon_pld=eps_pld, delta=delta, metrics=metrics,
        )
        run.status, run.progress, run.stage, run.finished_at = "succeeded", 1.0, "published", utcnow()
        log.info("run %s published model version %s of %r", run_id, version.id, ds.name)



def _utility(model: Any) -> dict[str, Any]:
    """The utility indicator of ``model`` (post-processing of its released counts), as a metric."""
    release = get_algorithm(model.algorithm).count_release(model)
    return {} if release is None else {"utility": utility_indicator(release).to_dict()}


def reap_stale_runs(*, settings: Settings, url: str | None = None,
                    dead_worker_prefix: str | None = None) -> list[int]:
    """Fail running runs whose worker vanished (reservation stays spent): a stale heartbeat, or
    (``dead_worker_prefix``, at a worker's start-up) a run held by this worker's dead previous
    incarnation, which is failed at once."""
    s_ = settings
    url = open_database(s_, url)
    failed: list[int] = []
    with session_scope(url) as s:
        ids = runs_store(s).running_run_ids()
    for run_id in ids:
        with session_scope(url) as s:
            run = lock_run(s, run_id)
            if run is None or run.status != "running":
                continue
            dead = dead_worker_prefix is not None and (run.worker or "").startswith(dead_worker_prefix)
            if dead or is_stale(run, s_.run_stale_after_s):
                fail_vanished(s, run)
                failed.append(run_id)
    if failed:
        log.warning("failed %d training run(s) whose worker vanished", len(failed))
    return failed

