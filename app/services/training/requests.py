"""Training requests: the run's privacy event from public facts, reserved before any data is read.

``start_training`` (API, CLI, scheduler) computes the run's event from the calibrated config
*before* any data is read, inserts the run (``queued``) and reserves the event in the ledger in
the caller's transaction. The caller commits, then hands the run to
:func:`app.services.training.dispatch.enqueue_run` (the run row is the outbox). Every check here
reads public facts only: the data set's declarations, its public catalogue size, the budget.
Calibration follows the algorithm's own accountant (``app.core.algorithms``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy.orm import Session

from app import ledger
from app.config import Settings
from app.core.algorithms import Algorithm, DatasetFacts, get_algorithm, resolve_hyperparameters
from app.core.privacy.accounting import epsilon_rdp as _eps_rdp
from app.core.privacy.accounting import event_to_json
from app.core.privacy.blocks import LEGACY, USER_PERIOD
from app.db.models import Dataset, RunStatus, TrainingRun, as_aware, utcnow
from app.db.session import open_database, session_scope
from app.db.stores.runs import runs_store
from app.errors import (
    BudgetExceeded,
    CalibrationFailed,
    CatalogueTooSmall,
    IdempotencyKeyReused,
    InvalidEpsilon,
    InvalidHyperparameters,
    InvalidIdempotencyKey,
    SecretHyperparameter,
    UnknownAlgorithm,
    UnknownTrainingRun,
)
from app.schemas.admin import TrainingRunOut
from app.schemas.common import require_valid_page
from app.schemas.hyperparameters import sampler_refusal
from app.services.budget import get_dataset
from app.services.catalog import refuse_votes_per_period
from app.services.training.cancel import CANCELLED_STAGE
from app.services.training.dispatch import enqueue_run

__all__ = [
    "MIN_EPSILON",
    "RETRY_WINDOW_S",
    "request_digest",
    "SECRET_CONFIG_KEYS",
    "base_config",
    "data_params",
    "resolved_hyperparameters",
    "check_public_shape",
    "dataset_facts",
    "n_items_of",
    "start_training",
    "submit_training",
    "get_run",
    "list_runs",
    "run_out",
]

SECRET_CONFIG_KEYS = ("seed",)  # never stored or published: it would let anyone strip the noise
MIN_EPSILON = 1e-3  # smaller targets need absurd noise and are refused
# A manual request without an idempotency key that repeats one of the last RETRY_WINDOW_S
# seconds (same actor, same body) is a blind retry: it gets the earlier run, not a second charge.
RETRY_WINDOW_S = 60.0
_DERIVED_KEY_PREFIX = "auto:"


def base_config(algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None):
    """The (uncalibrated) config: defaults + caller's public hyper-parameters."""
    params = dict(hyperparameters or {})
    for key in SECRET_CONFIG_KEYS:
        if key in params:
            raise SecretHyperparameter(f"hyper-parameter {key!r} cannot be chosen: the service draws it secretly per run")
    try:
        return algo.config_from_params(params, (ds.rating_min, ds.rating_max))
    except (TypeError, ValueError) as exc:
        raise InvalidHyperparameters(f"invalid {algo.name} hyper-parameters: {exc}") from exc


_UNSET: Any = object()


def run_user_bound(ds: Dataset, cohorts: Sequence[str]) -> int | None:
    """The public bound on the users a run reading ``cohorts`` can meet: the declared per-period
    bound times its non-legacy blocks, plus ``max_users`` for ``legacy`` (every user before blocks
    existed), never above ``max_users`` (the data set's whole life); ``max_users`` alone when no
    per-period bound is declared; None when a block it reads has no declared bound. A ``user_period``
    data set counts (user, period) units instead (:func:`_unit_bound`)."""
    if ds.privacy_unit == USER_PERIOD:
        return _unit_bound(ds, cohorts)
    if ds.max_users_per_period is None:
        return ds.max_users
    reads_legacy = LEGACY in cohorts
    if reads_legacy and ds.max_users is None:
        return None
    bound = ds.max_users_per_period * sum(1 for c in cohorts if c != LEGACY) + (ds.max_users or 0) * reads_legacy
    return max(1, min(bound, ds.max_users) if ds.max_users is not None else bound)


def _unit_bound(ds: Dataset, cohorts: Sequence[str]) -> int | None:
    """``user_period``: a run's rows are (user, period) units, at most one per user in each period it
    reads (``legacy`` holds none): the per-period bound, else ``max_users``, times those periods."""
    per_period = ds.max_users_per_period if ds.max_users_per_period is not None else ds.max_users
    if per_period is None:
        return None
    if ds.max_users is not None:
        per_period = min(per_period, ds.max_users)
    return max(1, per_period * sum(1 for c in cohorts if c != LEGACY))


def dataset_facts(ds: Dataset, n_items: int, max_users: int | None = _UNSET) -> DatasetFacts:
    """What an algorithm may know about a data set before any private data is read: the
    administrator's declarations and the public catalogue size (``max_users``: a run's own bound,
    :func:`run_user_bound`; the data set's declared one by default)."""
    bound = ds.max_users if max_users is _UNSET else max_users
    return DatasetFacts(name=ds.name, kind=ds.kind, rating_range=(ds.rating_min, ds.rating_max), n_items=n_items,
                        max_users=bound, vote_local_epsilon=ds.vote_local_epsilon,
                        votes_per_user_cap=ds.votes_per_user_cap)


def data_params(algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None,
                max_users: int | None = _UNSET) -> dict[str, Any]:
    """Hyper-parameters with what the data set decides for the algorithm
    (:meth:`app.core.algorithms.Algorithm.data_params`; 422 when the caller chose it)."""
    try:
        return algo.data_params(dict(hyperparameters or {}), dataset_facts(ds, n_items=0, max_users=max_users))
    except ValueError as exc:
        raise InvalidHyperparameters(str(exc)) from exc


def resolved_hyperparameters(
    algo: Algorithm, ds: Dataset, hyperparameters: dict[str, Any] | None, objective: str | None,
    epsilon: float, delta: float, n_items: int, max_users: int | None = _UNSET,
) -> dict[str, Any]:
    """The caller's hyper-parameters, or the ε-aware defaults (public facts only) when none."""
    try:
        params, _ = resolve_hyperparameters(
            algo.name, dict(hyperparameters or {}), objective=objective, epsilon=epsilon, delta=delta,
            rating_range=(ds.rating_min, ds.rating_max), n_items=n_items,
            max_users=ds.max_users if max_users is _UNSET else max_users,
        )
    except ValueError as exc:
        raise InvalidHyperparameters(str(exc)) from exc
    return params


def check_public_shape(algo: Algorithm, config: Any, n_items: int) -> None:
    """Size limits decided from public facts before any data is read (422 otherwise)."""
    if n_items < algo.min_items:
        raise CatalogueTooSmall(f"{algo.name} needs at least {algo.min_items} item(s) in the data set's public "
                                "catalogue: add items first (PUT /v1/datasets/{dataset}/items/{item_id} or "
                                "privrec import-items)")
    try:
        algo.check_public_shape(config, n_items)
    except ValueError as exc:
        raise InvalidHyperparameters(f"invalid {algo.name} run: {exc}") from exc


def n_items_of(session: Session, ds: Dataset) -> int:
    """The public catalogue size (every item of the data set, as training loads them)."""
    return runs_store(session).catalogue_size(ds.id)


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
    now: datetime | None = None,
    retry_window_s: float = 0.0,
    read_current_block: bool = True,
) -> TrainingRun:
    """Create a queued run and reserve its privacy cost (in the caller's transaction) on the privacy
    blocks that can pay for it at ``now`` (the clock, injectable: the run is created at it), recorded
    on the run; without ``read_current_block`` (a retrain policy's choice) the still-open current
    period's block is not read.

    Exactly one of ``epsilon`` (this run's target) or ``epsilon_fraction`` (of the remaining
    budget, in (0, 1]) is given, or neither for a run whose event costs nothing (post-processing:
    ``onebit`` on votes randomised at ingestion, whose guarantee the ledger already holds); it
    is still reserved and committed, with a zero-cost event, so the ledger lists every run.
    With ``retry_window_s`` (> 0, at most :data:`RETRY_WINDOW_S`) a request without a key is
    matched to the same actor's identical request of that window (a blind retry gets the earlier
    run); an idempotency key replayed with another body is 409 ``idempotency_key_reused``.
    Raises InvalidRequest / BudgetExceeded; does not commit. After committing, call
    :func:`enqueue_run` with the run id.
    """
    try:
        algo = get_algorithm(algorithm)
    except ValueError as exc:
        raise UnknownAlgorithm(str(exc)) from exc
    free_run = epsilon is None and epsilon_fraction is None
    if epsilon is not None and epsilon_fraction is not None:
        raise InvalidEpsilon("give exactly one of epsilon or epsilon_fraction")
    if epsilon is not None and (
        not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < MIN_EPSILON
    ):
        raise InvalidEpsilon(f"epsilon must be a finite number >= {MIN_EPSILON}")
    if epsilon_fraction is not None and (
        not isinstance(epsilon_fraction, (int, float)) or not math.isfinite(epsilon_fraction) or not 0 < epsilon_fraction <= 1
    ):
        raise InvalidEpsilon("epsilon_fraction must lie in (0, 1]")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 128:
        raise InvalidIdempotencyKey("idempotency_key must have 1 to 128 characters")
    digest = request_digest(actor=actor, algorithm=algorithm, epsilon=epsilon, epsilon_fraction=epsilon_fraction,
                            hyperparameters=hyperparameters, objective=objective)
    ds = get_dataset(session, dataset)
    if algo.data == "votes":
        refuse_votes_per_period(ds.name, ds.privacy_unit)
    acct = ledger.lock_account(session, ds.id)  # serialises requests on this budget
    existing, idempotency_key = _earlier_request(session, ds.id, idempotency_key, digest, retry_window_s)
    if existing is not None:
        return existing
    if epsilon is None and epsilon_fraction is not None:
        prior = ledger.current_block_spent(session, acct, now)  # the block users join now
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
    n_items = n_items_of(session, ds)
    # the blocks it may read (ledger and calendar only): the public bound on the users it can meet
    users = run_user_bound(ds, ledger.cohorts_with_room(session, acct, now, read_current_block))
    if epsilon is None:  # a free run: no target to calibrate to
        if objective is not None:
            raise InvalidHyperparameters(f"{algo.name} has no objective choice")
        config, epsilon = base_config(algo, ds, data_params(algo, ds, hyperparameters, users)), 0.0
    else:
        hyperparameters = resolved_hyperparameters(algo, ds, hyperparameters, objective, float(epsilon), acct.delta,
                                                   n_items, users)
        base = base_config(algo, ds, data_params(algo, ds, hyperparameters, users))
        try:
            config = algo.calibrate(float(epsilon), acct.delta, base, n_items)
        except ValueError as exc:
            raise CalibrationFailed(f"cannot calibrate {algo.name} to epsilon {epsilon}: {exc}") from exc
    check_public_shape(algo, config, n_items)
    event = algo.event(config, n_items)
    _check_sampler_range(algo, event, config, n_items)
    if free_run and _eps_rdp(event, acct.delta) != 0.0:
        raise InvalidEpsilon("give exactly one of epsilon or epsilon_fraction (only a run that costs "
                             "nothing, e.g. onebit on votes randomised at ingestion, may omit both)")
    run = TrainingRun(
        dataset_id=ds.id,
        algorithm=algorithm,
        config=algo.public_config(config),
        requested_epsilon=float(epsilon),
        delta=acct.delta,
        status="queued",
        progress=0.0,
        stage="queued",
        trigger=trigger,
        actor=actor,
        idempotency_key=idempotency_key,
        request_digest=digest,
        ratings_version=ds.ratings_version,
        created_at=now or utcnow(),
    )
    session.add(run)
    session.flush()
    entry = ledger.reserve(session, dataset=ds, event=event, parameters=algo.event_parameters(config), actor=actor,
                           run_id=run.id, now=now, read_current=read_current_block)
    run.epsilon_charged = entry.epsilon  # the run alone as the ledger charged it (the account's relation)
    run.cohorts = list(entry.parameters.get("cohorts", []))  # the blocks it reads, chosen before any read
    return run



def request_digest(*, actor: str, algorithm: str, epsilon: float | None, epsilon_fraction: float | None,
                   hyperparameters: dict[str, Any] | None, objective: str | None) -> str:
    """SHA-256 of who asked for what (actor and request body, canonical JSON): an idempotency
    key replayed with another body is refused, and a keyless retry is recognised by it."""
    body = {"actor": actor, "algorithm": algorithm, "epsilon": epsilon, "epsilon_fraction": epsilon_fraction,
            "hyperparameters": hyperparameters or {}, "objective": objective}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=repr).encode()).hexdigest()


def _derived_key(digest: str, window: int) -> str:
    return f"{_DERIVED_KEY_PREFIX}{digest}:{window}"


def _earlier_request(session: Session, dataset_id: int, key: str | None, digest: str,
                     retry_window_s: float) -> tuple[TrainingRun | None, str | None]:
    """(the run an earlier identical request created, the key the new run is stored with).

    With a key: the run of that key (409 ``idempotency_key_reused`` when its body differed).
    Without one and with ``retry_window_s`` > 0: the same actor's identical request of the last
    ``retry_window_s`` seconds, found by a key derived from the digest and the index of the
    :data:`RETRY_WINDOW_S`-long window (this window's, or the previous one's while young enough)."""
    store = runs_store(session)
    if key is not None:
        existing = store.run_by_idempotency_key(dataset_id, key)
        if existing is not None and existing.request_digest not in (None, digest):
            raise IdempotencyKeyReused("this idempotency_key was used for a different request body; "
                                       "use a new key for a new run")
        return existing, key
    if retry_window_s <= 0:
        return None, None
    now = utcnow()
    window = int(now.timestamp() // RETRY_WINDOW_S)
    cutoff = now - timedelta(seconds=min(retry_window_s, RETRY_WINDOW_S))
    for index in (window, window - 1):
        existing = store.run_by_idempotency_key(dataset_id, _derived_key(digest, index))
        if existing is not None and (index == window or as_aware(existing.created_at) > cutoff):
            return existing, None
    return None, _derived_key(digest, window)


def _check_sampler_range(algo: Algorithm, event: Any, config: Any, n_items: int) -> None:
    """422 before anything is reserved when a release is beyond the exact noise sampler's range
    for the catalogue the reservation uses (a run that cannot be drawn is never charged)."""
    refusal = sampler_refusal(algo.name, event_to_json(event), algo.public_config(config), n_items)
    if refusal is not None:
        raise InvalidHyperparameters(f"invalid {algo.name} hyper-parameters: {refusal}")


def submit_training(*, settings: Settings, url: str | None = None, **kwargs: Any) -> int:
    """``start_training`` in its own transaction, committed, then enqueued; returns the run id."""
    url = open_database(settings, url)
    with session_scope(url) as session:
        run = start_training(session, **kwargs)
        run_id = run.id
    enqueue_run(run_id, settings=settings, url=url)
    return run_id


def get_run(session: Session, *, run_id: int, dataset: str | None = None) -> TrainingRun:
    """Training run ``run_id`` (of ``dataset`` when given); NotFound otherwise."""
    run = session.get(TrainingRun, run_id)
    if run is None or (dataset is not None and run.dataset.name != dataset):
        raise UnknownTrainingRun(f"training run {run_id} not found", run_id=run_id)
    return run


def list_runs(session: Session, *, dataset: str, offset: int = 0, limit: int = 100) -> tuple[list[TrainingRun], int]:
    """One page of runs (newest first) and the total count."""
    require_valid_page(offset, limit)
    ds = get_dataset(session, dataset)
    return runs_store(session).runs_page(ds.id, offset, limit)


def _iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with its offset (SQLite hands back naive UTC times)."""
    aware = as_aware(value)
    return aware.isoformat() if aware is not None else None


def run_out(run: TrainingRun) -> TrainingRunOut:
    """The public view of a run (its public config only: the secret seed never reaches the row)."""
    return TrainingRunOut(
        id=run.id,
        dataset=run.dataset.name if run.dataset is not None else None,
        algorithm=run.algorithm,
        config=run.config,
        requested_epsilon=run.requested_epsilon,
        epsilon_charged=None if run.epsilon_charged is None else ledger.round_up(run.epsilon_charged),
        delta=run.delta,
        status=cast(RunStatus, run.status),  # ck_training_runs_status_kind admits RUN_STATUSES only
        progress=run.progress,
        stage=run.stage,
        error=run.error,
        trigger=run.trigger,
        actor=run.actor,
        refunded=run.refunded,
        cancelled=run.status == "failed" and run.stage == CANCELLED_STAGE,
        private_data_read=run.private_data_read,
        enqueued=run.enqueued_at is not None,
        attempts=run.attempts,
        created_at=_iso(run.created_at),
        started_at=_iso(run.started_at),
        finished_at=_iso(run.finished_at),
    )

