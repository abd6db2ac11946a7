"""The budget store: the reads of the budget views (data sets, run counts, ledger pages, person
budgets' members, privacy blocks). Every write of the ledger goes through :mod:`app.ledger`."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.privacy.blocks import LEGACY
from app.db.models import BudgetAccount, Dataset, LedgerEntry, PersonBudget, PrivacyBlock, TrainingRun

__all__ = ["find_dataset", "add_dataset", "run_counts", "entry_count", "ledger_page", "member_names", "last_reservation",
           "dataset_names", "person_budgets", "find_person_budget", "blocks_page"]


def find_dataset(session: Session, name: str) -> Dataset | None:
    """The data set ``name``, if any."""
    return session.scalar(select(Dataset).where(Dataset.name == name))


def add_dataset(session: Session, ds: Dataset) -> Dataset:
    """Insert ``ds`` (flushed: its id is set)."""
    session.add(ds)
    session.flush()
    return ds


def run_counts(session: Session, dataset_id: int) -> dict[str, int]:
    """Training runs of the data set by status."""
    rows = session.execute(select(TrainingRun.status, func.count()).where(TrainingRun.dataset_id == dataset_id)
                           .group_by(TrainingRun.status)).all()
    return {str(status): int(n) for status, n in rows}


def entry_count(session: Session, account_id: int, kind: str | None = None) -> int:
    """The account's ledger entries (of ``kind`` only, when given)."""
    stmt = select(func.count()).select_from(LedgerEntry).where(LedgerEntry.account_id == account_id)
    if kind is not None:
        stmt = stmt.where(LedgerEntry.kind == kind)
    return int(session.scalar(stmt) or 0)


def ledger_page(session: Session, account_id: int, offset: int, limit: int) -> tuple[list[LedgerEntry], int]:
    """One page of the account's entries in sequence order, and their total count."""
    rows = session.scalars(select(LedgerEntry).where(LedgerEntry.account_id == account_id)
                           .order_by(LedgerEntry.seq).offset(offset).limit(limit))
    return list(rows), entry_count(session, account_id)


def last_reservation(session: Session, account_id: int) -> LedgerEntry | None:
    """The account's latest reservation entry, if any."""
    return session.scalar(select(LedgerEntry).where(LedgerEntry.account_id == account_id,
                                                    LedgerEntry.kind == "reservation")
                          .order_by(LedgerEntry.seq.desc()).limit(1))


def member_names(session: Session, person_budget_id: int) -> list[str]:
    """The data sets counting against the person budget, by name."""
    return list(session.scalars(
        select(Dataset.name).join(BudgetAccount, BudgetAccount.dataset_id == Dataset.id)
        .where(BudgetAccount.person_budget_id == person_budget_id).order_by(Dataset.name)))


def dataset_names(session: Session) -> list[str]:
    """Every data set's name, sorted."""
    return list(session.scalars(select(Dataset.name).order_by(Dataset.name)))


def person_budgets(session: Session) -> list[PersonBudget]:
    """Every person budget by name."""
    return list(session.scalars(select(PersonBudget).order_by(PersonBudget.name)))


def find_person_budget(session: Session, name: str) -> PersonBudget | None:
    """The person budget ``name``, if any."""
    return session.scalar(select(PersonBudget).where(PersonBudget.name == name))


def blocks_page(session: Session, owner: str, offset: int, limit: int) -> tuple[list[PrivacyBlock], int]:
    """One page of ``owner``'s opened blocks, the current period first and ``legacy`` last, and their count."""
    base = select(PrivacyBlock).where(PrivacyBlock.owner == owner)
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    rows = session.scalars(base.order_by(PrivacyBlock.cohort == LEGACY, PrivacyBlock.cohort.desc())
                           .offset(offset).limit(limit))
    return list(rows), int(total)
