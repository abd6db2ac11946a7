"""Admin use cases: thin adapters from the platform's budget, training and model-store services
to the API's response models. Nothing here commits; the routes do."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.schemas.admin import (BudgetOut, DatasetIn, DatasetOut, DatasetPatchIn, LedgerEntryOut, ModelVersionOut,
                               PersonBudgetIn, PersonBudgetOut, TrainingIn, TrainingRunOut)
from app.errors import Conflict
from app.schemas.common import Page

__all__ = [
    "sessionmaker_for",
    "create_dataset",
    "update_dataset",
    "dataset_warnings",
    "datasets_page",
    "budget_view",
    "person_budget_view",
    "put_person_budget",
    "change_cap",
    "ledger_page",
    "start_training",
    "enqueue",
    "run_view",
    "runs_page",
    "versions_page",
    "activate",
    "projection",
    "chain_status",
]


def sessionmaker_for(settings: Any) -> sessionmaker[Session]:
    from app.db.session import get_sessionmaker

    return get_sessionmaker(settings.database_url)


def dataset_warnings(ds: Any, delta: float) -> list[str]:
    """Warnings from public facts: delta above 1/(10 max_users) (a mechanism that releases one
    random user's data is then (0, delta)-DP for every user)."""
    if ds.max_users is not None and delta > 1.0 / (10.0 * ds.max_users):
        return [f"delta {delta:g} exceeds 1/(10 max_users) = {1.0 / (10.0 * ds.max_users):.3g}: with up to "
                f"{ds.max_users} users, lower delta (or max_users is too large a bound)"]
    return []


def _dataset_out(session: Session, ds: Any) -> DatasetOut:
    budget_out = budget_view(session, dataset=ds.name)
    return DatasetOut(name=ds.name, description=ds.description, rating_min=ds.rating_min,
                      rating_max=ds.rating_max, kind=ds.kind, max_users=ds.max_users,
                      warnings=dataset_warnings(ds, budget_out.delta), budget=budget_out)


def create_dataset(session: Session, *, body: DatasetIn, actor: str) -> DatasetOut:
    """Create a data set with its budget account (409 when the name is taken)."""
    from app.db.models import Dataset
    from app.services import budget

    if session.scalar(select(Dataset.id).where(Dataset.name == body.name)) is not None:
        raise Conflict(f"data set {body.name!r} exists", code="dataset_exists", details={"dataset": body.name})
    ds = budget.ensure_dataset(session, body.name, rating_min=body.rating_min, rating_max=body.rating_max,
                               epsilon_cap=body.epsilon_cap, delta=body.delta, description=body.description,
                               actor=actor, relation=body.neighbouring_relation.value,
                               person_budget=body.person_budget)
    ds.kind, ds.max_users = body.kind, body.max_users
    session.flush()
    return _dataset_out(session, ds)


def update_dataset(session: Session, *, dataset: str, body: DatasetPatchIn) -> DatasetOut:
    """Change the declared kind and/or the public bound ``max_users`` (null clears it)."""
    from app.services import budget

    ds = budget.get_dataset(session, dataset)
    if "kind" in body.model_fields_set and body.kind is not None:
        ds.kind = body.kind
    if "max_users" in body.model_fields_set:
        ds.max_users = body.max_users
    session.flush()
    return _dataset_out(session, ds)


def datasets_page(session: Session, *, offset: int, limit: int) -> Page[DatasetOut]:
    """All data sets with their budgets."""
    from app.db.models import Dataset

    total = session.scalar(select(func.count()).select_from(Dataset)) or 0
    rows = session.scalars(select(Dataset).order_by(Dataset.name).offset(offset).limit(limit)).all()
    return Page[DatasetOut].build([_dataset_out(session, d) for d in rows], total=int(total), offset=offset,
                                  limit=limit)


def budget_view(session: Session, *, dataset: str) -> BudgetOut:
    """Cap, delta, spend (RDP and PLD), remaining and runs."""
    from app.services import budget

    return BudgetOut(**budget.get_budget(session, dataset).to_dict())


def person_budget_view(session: Session, *, name: str) -> PersonBudgetOut:
    """A per-person budget with its composed spend over its data sets."""
    from app.services import budget

    return PersonBudgetOut(**budget.get_person_budget(session, name).to_dict())


def put_person_budget(session: Session, *, name: str, body: PersonBudgetIn, actor: str) -> PersonBudgetOut:
    """Create a per-person budget or change its cap (audited)."""
    from app.services import budget

    relation = None if body.neighbouring_relation is None else body.neighbouring_relation.value
    view = budget.put_person_budget(session, name, epsilon_cap=body.epsilon_cap, delta=body.delta, relation=relation,
                                    reason=body.reason, actor=actor)
    return PersonBudgetOut(**view.to_dict())


def change_cap(session: Session, *, dataset: str, epsilon_cap: float, reason: str | None, actor: str) -> BudgetOut:
    """Change the cap (raising needs a reason; lowering below spend is refused with 409)."""
    from app.services import budget

    return BudgetOut(**budget.change_cap(session, dataset, new_cap=epsilon_cap, reason=reason, actor=actor).to_dict())


def ledger_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[LedgerEntryOut]:
    """One page of ledger entries with their event trees and parameters."""
    from app.services import budget

    rows, total = budget.list_ledger(session, dataset, offset=offset, limit=limit)
    items = [LedgerEntryOut(**budget.ledger_entry_dict(r)) for r in rows]
    return Page[LedgerEntryOut].build(items, total=total, offset=offset, limit=limit)


def start_training(session: Session, *, dataset: str, body: TrainingIn, actor: str) -> int:
    """Reserve budget and queue a run; return its id (caller commits, then :func:`enqueue`)."""
    from app.services import training

    run = training.start_training(
        session, dataset=dataset, algorithm=body.algorithm, epsilon=body.epsilon,
        epsilon_fraction=body.epsilon_fraction, hyperparameters=body.hyperparameters or None,
        objective=body.objective, actor=actor, trigger="manual", idempotency_key=body.idempotency_key,
    )
    return int(run.id)


def enqueue(run_id: int, settings: Any) -> bool:
    """Send the run to the workers (only after the reservation is committed); False when the
    broker is unreachable and the run waits in the outbox."""
    from app.services import training

    return training.enqueue_run(run_id, settings)


def run_view(session: Session, *, run_id: int) -> TrainingRunOut:
    from app.services import training

    return TrainingRunOut(**training.run_dict(training.get_run(session, run_id)))


def runs_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[TrainingRunOut]:
    from app.services import training

    rows, total = training.list_runs(session, dataset, offset=offset, limit=limit)
    return Page[TrainingRunOut].build([TrainingRunOut(**training.run_dict(r)) for r in rows],
                                      total=total, offset=offset, limit=limit)


def versions_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[ModelVersionOut]:
    from app import model_store

    rows, total = model_store.list_versions(session, dataset, offset=offset, limit=limit)
    return Page[ModelVersionOut].build([ModelVersionOut(**model_store.version_dict(r)) for r in rows],
                                       total=total, offset=offset, limit=limit)


def activate(session: Session, *, dataset: str, version_id: int, actor: str) -> ModelVersionOut:
    """Make an older (or newer) version active: a rollback in one transaction."""
    from app import model_store

    row = model_store.activate_version(session, dataset, version_id, actor=actor)
    return ModelVersionOut(**model_store.version_dict(row))


def projection(session: Session, *, dataset: str, epsilon: float, algorithm: str | None = None) -> dict[str, Any]:
    """What one more run at ``epsilon`` composes to and how many are affordable."""
    from app.services import projection as proj

    return proj.project_run(session, dataset=dataset, epsilon=epsilon, algorithm=algorithm).to_dict()


def chain_status(session: Session, *, dataset: str) -> dict[str, Any]:
    """The hash chain's verification (every hash and every stored spend recomputed)."""
    from app.services import budget

    return budget.verify_ledger(session, dataset, recompute_spend=True)
