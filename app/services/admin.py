"""Admin use cases: data sets, budgets, trainings and model versions, as the API's typed response
models. Nothing here commits: the caller's unit of work does."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app import model_store
from app.config import Settings
from app.db.models import ModelVersion
from app.db.stores import admin as admin_store
from app.errors import DatasetExists, PrivacyUnitFixed, PrivrecError
from app.ledger import round_up
from app.schemas.admin import (
    BlockOut,
    BudgetOut,
    DatasetIn,
    DatasetOut,
    DatasetPatchIn,
    ForecastOut,
    LedgerEntryOut,
    ModelVersionOut,
    PersonBudgetIn,
    PersonBudgetOut,
    ProjectionOut,
    RetrainPolicyIn,
    RetrainPolicyOut,
    TrainingIn,
    TrainingRunOut,
)
from app.schemas.common import Page
from app.services import budget, catalog, policy
from app.services.training import cancel, dispatch
from app.services.training import forecast as ahead
from app.services.training import projection as proj
from app.services.training import requests as training

__all__ = [
    "create_dataset",
    "update_dataset",
    "dataset_warnings",
    "datasets_page",
    "budget_view",
    "blocks_page",
    "retrain_policy",
    "set_retrain_policy",
    "forecast_view",
    "person_budget_view",
    "put_person_budget",
    "change_cap",
    "ledger_page",
    "start_training",
    "enqueue",
    "run_view",
    "runs_page",
    "version_out",
    "versions_page",
    "activate",
    "unpin",
    "projection",
    "chain_status",
]


def dataset_warnings(ds: Any, budget_out: BudgetOut) -> list[str]:
    """Warnings from public facts: delta above 1/(10 max_users) (a mechanism that releases one
    random user's data is then (0, delta)-DP for every user), and a cap above its person budget's
    (which then binds first: the data set's cap promises more than it can spend)."""
    warnings, delta = [], budget_out.delta
    if ds.max_users is not None and delta > 1.0 / (10.0 * ds.max_users):
        warnings.append(f"delta {delta:g} exceeds 1/(10 max_users) = {1.0 / (10.0 * ds.max_users):.3g}: with up to "
                        f"{ds.max_users} users, lower delta (or max_users is too large a bound)")
    person = budget_out.person_budget
    if person is not None and budget_out.epsilon_cap > person.epsilon_cap:
        warnings.append(f"epsilon cap {budget_out.epsilon_cap:g} exceeds the cap {person.epsilon_cap:g} of person "
                        f"budget {person.name!r}, which binds first")
    return warnings


def _dataset_out(session: Session, ds: Any) -> DatasetOut:
    budget_out = budget_view(session, dataset=ds.name)
    return DatasetOut(name=ds.name, description=ds.description, rating_min=ds.rating_min,
                      rating_max=ds.rating_max, kind=ds.kind, max_users=ds.max_users,
                      max_users_per_period=ds.max_users_per_period, privacy_unit=ds.privacy_unit,
                      warnings=dataset_warnings(ds, budget_out), budget=budget_out)


def create_dataset(session: Session, *, body: DatasetIn, actor: str) -> DatasetOut:
    """Create a data set with its budget account (409 when the name is taken)."""
    if admin_store.dataset_exists(session, body.name):
        raise DatasetExists(f"data set {body.name!r} exists", details={"dataset": body.name})
    _check_unit_fits_kind(body.privacy_unit, body.kind, body.name)
    ds = budget.ensure_dataset(session, body.name, rating_min=body.rating_min, rating_max=body.rating_max,
                               epsilon_cap=body.epsilon_cap, delta=body.delta, description=body.description,
                               actor=actor, relation=body.neighbouring_relation.value,
                               person_budget=body.person_budget, privacy_unit=body.privacy_unit)
    ds.kind, ds.max_users, ds.max_users_per_period = body.kind, body.max_users, body.max_users_per_period
    session.flush()
    return _dataset_out(session, ds)


def update_dataset(session: Session, *, dataset: str, body: DatasetPatchIn) -> DatasetOut:
    """Change the declared kind and/or the public bound ``max_users`` (null clears it)."""
    ds = budget.get_dataset(session, dataset)
    if body.privacy_unit is not None and body.privacy_unit != ds.privacy_unit:
        raise PrivacyUnitFixed(f"data set {ds.name!r} declared the privacy unit {ds.privacy_unit!r} at creation; "
                               "it never changes (create another data set for another unit)",
                               dataset=ds.name, privacy_unit=ds.privacy_unit)
    if "kind" in body.model_fields_set and body.kind is not None:
        _check_unit_fits_kind(ds.privacy_unit, body.kind, ds.name)
        ds.kind = body.kind
    if "max_users" in body.model_fields_set:
        ds.max_users = body.max_users
    if "max_users_per_period" in body.model_fields_set:
        ds.max_users_per_period = body.max_users_per_period
    session.flush()
    return _dataset_out(session, ds)


def _check_unit_fits_kind(unit: str, kind: str, name: str) -> None:
    if kind == "votes":
        catalog.refuse_votes_per_period(name, unit)


def datasets_page(session: Session, *, offset: int, limit: int) -> Page[DatasetOut]:
    """All data sets with their budgets."""
    rows, total = admin_store.datasets_page(session, offset, limit)
    return Page[DatasetOut].build([_dataset_out(session, d) for d in rows], total=total, offset=offset,
                                  limit=limit)


def budget_view(session: Session, *, dataset: str) -> BudgetOut:
    """Cap, delta, spend (RDP and PLD), remaining and runs."""
    return BudgetOut.model_validate(budget.get_budget(session, dataset=dataset), from_attributes=True)


def blocks_page(session: Session, *, dataset: str | None = None, person_budget: str | None = None, offset: int,
                limit: int, settings: Settings | None = None) -> Page[BlockOut]:
    """One page of a data set's (or a person budget's) privacy blocks, the current period first; a
    data set's with each block's retirement forecast at its retrain policy (given ``settings``)."""
    rows, total = budget.list_blocks(session, dataset=dataset, person_budget=person_budget, offset=offset, limit=limit)
    items = [BlockOut.model_validate(r, from_attributes=True) for r in rows]
    if dataset is not None and settings is not None:
        blocks = _forecast_blocks(session, dataset, settings)
        items = [_with_forecast(item, blocks.get(item.cohort)) for item in items]
    return Page[BlockOut].build(items, total=total, offset=offset, limit=limit)


def _forecast_blocks(session: Session, dataset: str, settings: Settings) -> dict[str, ahead.BlockForecast]:
    try:
        return ahead.forecast(session, dataset=dataset, settings=settings).blocks
    except PrivrecError:  # no next run can be built (the forecast route says why)
        return {}


def _with_forecast(item: BlockOut, f: ahead.BlockForecast | None) -> BlockOut:
    if f is None:
        return item
    return item.model_copy(update={"runs_left": f.runs_left, "runs_left_capped": f.capped, "retires_at": f.retires_at,
                                   "retired": f.retired})


def _policy_out(p: policy.RetrainPolicy) -> RetrainPolicyOut:
    return RetrainPolicyOut.model_validate(p, from_attributes=True)


def retrain_policy(session: Session, *, dataset: str, settings: Settings) -> RetrainPolicyOut:
    """The data set's retrain policy in force (its own values, the deployment's where it has none)."""
    return _policy_out(policy.get_policy(session, dataset=dataset, settings=settings))


def set_retrain_policy(session: Session, *, dataset: str, body: RetrainPolicyIn, settings: Settings,
                       actor: str) -> RetrainPolicyOut:
    """Replace the data set's retrain policy (a field left out: the deployment's setting)."""
    return _policy_out(policy.set_policy(session, dataset=dataset, settings=settings, actor=actor,
                                         interval_s=body.interval_s, epsilon=body.epsilon,
                                         min_payable_blocks=body.min_payable_blocks,
                                         read_current_block=body.read_current_block))


def forecast_view(session: Session, *, dataset: str, settings: Settings) -> ForecastOut:
    """When the data set's blocks retire at its retrain policy, and the warnings ahead of it."""
    f = ahead.forecast(session, dataset=dataset, settings=settings)
    return ForecastOut(dataset=f.dataset, policy=_policy_out(f.policy), next_run_at=f.next_run_at,
                       run_epsilon_rdp=f.run_epsilon_rdp, payable_blocks=f.payable_blocks,
                       shortfall_at=f.shortfall_at, legacy_retires_at=f.legacy_retires_at, warnings=f.warnings)


def person_budget_view(session: Session, *, name: str) -> PersonBudgetOut:
    """A per-person budget with its composed spend over its data sets."""
    return PersonBudgetOut.model_validate(budget.get_person_budget(session, name=name), from_attributes=True)


def put_person_budget(session: Session, *, name: str, body: PersonBudgetIn, actor: str) -> PersonBudgetOut:
    """Create a per-person budget or change its cap (audited)."""
    relation = None if body.neighbouring_relation is None else body.neighbouring_relation.value
    view = budget.put_person_budget(session, name=name, epsilon_cap=body.epsilon_cap, delta=body.delta, relation=relation,
                                    reason=body.reason, actor=actor, privacy_unit=body.privacy_unit)
    return PersonBudgetOut.model_validate(view, from_attributes=True)


def change_cap(session: Session, *, dataset: str, epsilon_cap: float, reason: str | None, actor: str) -> BudgetOut:
    """Change the cap (raising needs a reason; lowering below spend is refused with 409)."""
    view = budget.change_cap(session, dataset=dataset, new_cap=epsilon_cap, reason=reason, actor=actor)
    return BudgetOut.model_validate(view, from_attributes=True)


def ledger_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[LedgerEntryOut]:
    """One page of ledger entries with their event trees and parameters."""
    rows, total = budget.list_ledger(session, dataset=dataset, offset=offset, limit=limit)
    return Page[LedgerEntryOut].build([budget.ledger_entry_out(r) for r in rows], total=total, offset=offset,
                                      limit=limit)


def start_training(session: Session, *, dataset: str, body: TrainingIn, actor: str) -> int:
    """Reserve budget and queue a run; return its id (caller commits, then :func:`enqueue`)."""
    run = training.start_training(
        session, dataset=dataset, algorithm=body.algorithm, epsilon=body.epsilon,
        epsilon_fraction=body.epsilon_fraction, hyperparameters=body.hyperparameters or None,
        objective=body.objective, actor=actor, trigger="manual", idempotency_key=body.idempotency_key,
        retry_window_s=training.RETRY_WINDOW_S,
    )
    return int(run.id)


def enqueue(run_id: int, settings: Settings) -> bool:
    """Send the run to the workers (only after the reservation is committed); False when the
    broker is unreachable and the run waits in the outbox."""
    return dispatch.enqueue_run(run_id, settings=settings)


def cancel_training(session: Session, *, run_id: int, actor: str) -> TrainingRunOut:
    """Cancel a queued or running run (refunded only if it read nothing); the caller commits."""
    return training.run_out(cancel.cancel_run(session, run_id=run_id, actor=actor))


def run_view(session: Session, *, run_id: int) -> TrainingRunOut:
    """One run's status, progress and charge."""
    return training.run_out(training.get_run(session, run_id=run_id))


def runs_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[TrainingRunOut]:
    """One page of the data set's runs, newest first."""
    rows, total = training.list_runs(session, dataset=dataset, offset=offset, limit=limit)
    return Page[TrainingRunOut].build([training.run_out(r) for r in rows], total=total, offset=offset, limit=limit)


def version_out(row: ModelVersion) -> ModelVersionOut:
    """The public view of a model version (its release: epsilons rounded up, metrics, metadata)."""
    return ModelVersionOut(
        id=row.id, model_version=row.id, dataset_version=row.version, version=row.version,
        run_id=row.run_id, algorithm=row.algorithm, sha256=row.sha256,
        epsilon=round_up(row.epsilon), epsilon_pld=None if row.epsilon_pld is None else round_up(row.epsilon_pld),
        delta=row.delta, n_items=row.n_items, rank=row.rank, metrics=row.metrics, metadata=row.model_metadata,
        utility=(row.metrics or {}).get("utility"), active=row.active,
        pinned=row.active and row.dataset.model_pinned, created_at=row.created_at.isoformat(),
        activated_at=row.activated_at.isoformat() if row.activated_at else None,
    )


def versions_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[ModelVersionOut]:
    """One page of the data set's model versions."""
    rows, total = model_store.list_versions(session, dataset, offset=offset, limit=limit)
    return Page[ModelVersionOut].build([version_out(r) for r in rows], total=total, offset=offset, limit=limit)


def activate(session: Session, *, dataset: str, version_id: int, actor: str) -> ModelVersionOut:
    """Make an older (or newer) version active and pin it: a rollback that sticks, in one transaction."""
    return version_out(model_store.activate_version(session, dataset, version_id, actor=actor))


def unpin(session: Session, *, dataset: str, actor: str) -> ModelVersionOut:
    """Unpin the data set's model and activate its newest version."""
    return version_out(model_store.unpin(session, dataset, actor=actor))


def projection(session: Session, *, dataset: str, epsilon: float, algorithm: str | None = None) -> ProjectionOut:
    """What one more run at ``epsilon`` composes to and how many are affordable."""
    return ProjectionOut.model_validate(proj.project_run(session, dataset=dataset, epsilon=epsilon, algorithm=algorithm),
                                        from_attributes=True)


def chain_status(session: Session, *, dataset: str) -> dict[str, Any]:
    """The hash chain's verification (every hash and every stored spend recomputed)."""
    return budget.verify_ledger(session, dataset=dataset, recompute_spend=True)
