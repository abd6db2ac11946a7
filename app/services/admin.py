"""Admin use cases: thin adapters from the platform's budget, training and model-store services
to the API's response models. Nothing here commits; the routes do."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.schemas.admin import BudgetOut, LedgerEntryOut, ModelVersionOut, TrainingIn, TrainingRunOut
from app.schemas.common import Page

__all__ = [
    "sessionmaker_for",
    "budget_view",
    "change_cap",
    "ledger_page",
    "start_training",
    "enqueue",
    "run_view",
    "runs_page",
    "versions_page",
    "activate",
]


def sessionmaker_for(settings: Any) -> sessionmaker[Session]:
    from app.db.session import get_sessionmaker

    return get_sessionmaker(settings.database_url)


def budget_view(session: Session, *, dataset: str) -> BudgetOut:
    """Cap, delta, spend (RDP and PLD), remaining and runs."""
    from app.services import budget

    return BudgetOut(**budget.get_budget(session, dataset).to_dict())


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
        actor=actor, trigger="manual", idempotency_key=body.idempotency_key,
    )
    return int(run.id)


def enqueue(run_id: int, settings: Any) -> None:
    """Send the run to the workers (only after the reservation is committed)."""
    from app.services import training

    training.enqueue_run(run_id, settings)


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
