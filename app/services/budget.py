"""Budget service: data sets and their privacy budget (view, cap changes, ledger listing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app import ledger
from app.config import Settings
from app.db.models import BudgetAccount, Dataset, LedgerEntry, PersonBudget, TrainingRun
from app.errors import DeltaRequired, InvalidDatasetName, InvalidRatingRange, PersonBudgetFixed
from app.schemas.admin import LedgerEntryOut
from app.schemas.common import require_valid_page
from app.services.catalog import get_dataset  # one definition; re-exported for the training services

__all__ = [
    "BudgetView",
    "PersonBudgetView",
    "get_person_budget",
    "put_person_budget",
    "get_dataset",
    "ensure_dataset",
    "bootstrap",
    "get_budget",
    "change_cap",
    "list_ledger",
    "ledger_entry_out",
    "verify_ledger",
    "verify_all",
]


@dataclass(frozen=True)
class PersonBudgetView:
    """A per-person budget: the events of all its data sets composed at its delta, under its relation."""

    name: str
    epsilon_cap: float
    delta: float
    neighbouring_relation: str
    spent_epsilon_rdp: float
    spent_epsilon_pld: float
    remaining_epsilon: float
    datasets: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class BudgetView:
    """A data set's budget; epsilons rounded conservatively (spent up, remaining down).
    ``remaining_epsilon`` is the least over every cap that applies; ``binding_cap`` names it."""

    dataset: str
    epsilon_cap: float
    delta: float
    accountant: str
    spent_epsilon_rdp: float
    spent_epsilon_pld: float
    remaining_epsilon: float
    runs: dict[str, int] = field(default_factory=dict)
    n_entries: int = 0
    n_charged_runs: int = 0
    n_local_guarantees: int = 0  # ledger entries of kind "local" (randomisation at ingestion)
    neighbouring_relation: str = "add_or_remove_one_user"  # the account's: every number above holds under it
    neighbouring_relations: list[str] = field(default_factory=list)  # of the entries that cost budget
    person_budget: PersonBudgetView | None = None  # the per-person bound this data set counts against
    dataset_remaining_epsilon: float | None = None  # the data set's own cap minus its own spend
    binding_cap: str | None = None  # "dataset" or "person_budget": which remaining_epsilon is


def ensure_dataset(
    session: Session,
    name: str,
    *,
    rating_min: float,
    rating_max: float,
    epsilon_cap: float,
    delta: float,
    description: str | None = None,
    actor: str = "system",
    relation: str = "add_or_remove_one_user",
    person_budget: str = ledger.DEFAULT_PERSON_BUDGET,
) -> Dataset:
    """Return the data set ``name``, creating it with its budget account (under ``relation``, counting
    against the per-person budget ``person_budget``) if missing."""
    ds = session.scalar(select(Dataset).where(Dataset.name == name))
    if ds is not None:
        return ds
    if not name or len(name) > 64:
        raise InvalidDatasetName("a data set name must have 1 to 64 characters")
    if not rating_min < rating_max:
        raise InvalidRatingRange("rating_min must be below rating_max")
    ds = Dataset(name=name, rating_min=float(rating_min), rating_max=float(rating_max), description=description)
    session.add(ds)
    session.flush()
    ledger.open_account(session, ds, epsilon_cap=epsilon_cap, delta=delta, actor=actor, relation=relation,
                        person_budget=person_budget)
    return ds


def bootstrap(session: Session, settings: Settings) -> Dataset:
    """Create the default data set (and budget account) from settings when missing."""
    s = settings
    return ensure_dataset(
        session,
        s.default_dataset,
        rating_min=s.default_rating_min,
        rating_max=s.default_rating_max,
        epsilon_cap=s.default_epsilon_cap,
        delta=s.default_delta,
        description="default data set",
    )


def _account(session: Session, ds: Dataset) -> BudgetAccount:
    return ledger.account_for(session, ds.id)


def get_budget(session: Session, *, dataset: str) -> BudgetView:
    """Cap, delta, spent (RDP and PLD), remaining under every cap and run counts of a data set (read
    from the stored composed states: no composition)."""
    ds = get_dataset(session, dataset)
    acct = _account(session, ds)
    rep = ledger.spent(session, acct)
    counts = dict(
        session.execute(
            select(TrainingRun.status, func.count()).where(TrainingRun.dataset_id == ds.id).group_by(TrainingRun.status)
        ).all()
    )
    n_entries = session.scalar(select(func.count()).select_from(LedgerEntry).where(LedgerEntry.account_id == acct.id)) or 0
    n_local = session.scalar(select(func.count()).select_from(LedgerEntry).where(
        LedgerEntry.account_id == acct.id, LedgerEntry.kind == "local")) or 0
    own_remaining = ledger.remaining(acct.epsilon_cap, rep.epsilon_rdp)
    person = _person_view(session, acct.person_budget)
    binding = "dataset" if own_remaining <= person.remaining_epsilon else "person_budget"
    return BudgetView(
        dataset=ds.name,
        epsilon_cap=acct.epsilon_cap,
        delta=acct.delta,
        accountant=acct.accountant,
        spent_epsilon_rdp=ledger.round_up(rep.epsilon_rdp),
        spent_epsilon_pld=ledger.round_up(rep.epsilon_pld),
        remaining_epsilon=min(own_remaining, person.remaining_epsilon),
        dataset_remaining_epsilon=own_remaining,
        binding_cap=binding,
        runs={k: int(counts.get(k, 0)) for k in ("queued", "running", "succeeded", "failed")},
        n_entries=int(n_entries),
        n_charged_runs=rep.n_events - int(n_local),
        n_local_guarantees=int(n_local),
        neighbouring_relation=ledger.account_relation(acct).value,
        neighbouring_relations=ledger.charged_relations(session, acct.id),
        person_budget=person,
    )


def _person_view(session: Session, pb: PersonBudget) -> PersonBudgetView:
    rep = ledger.person_spent(session, pb)
    names = session.scalars(
        select(Dataset.name).join(BudgetAccount, BudgetAccount.dataset_id == Dataset.id)
        .where(BudgetAccount.person_budget_id == pb.id).order_by(Dataset.name)
    ).all()
    return PersonBudgetView(
        name=pb.name,
        epsilon_cap=pb.epsilon_cap,
        delta=pb.delta,
        neighbouring_relation=pb.relation,
        spent_epsilon_rdp=ledger.round_up(rep.epsilon_rdp),
        spent_epsilon_pld=ledger.round_up(rep.epsilon_pld),
        remaining_epsilon=ledger.remaining(pb.epsilon_cap, rep.epsilon_rdp),
        datasets=list(names),
        history=list(pb.history or []),
    )


def get_person_budget(session: Session, *, name: str) -> PersonBudgetView:
    """A per-person budget: cap, delta, relation, composed spend over its data sets, cap history."""
    return _person_view(session, ledger.person_budget_named(session, name))


def put_person_budget(
    session: Session, *, name: str, epsilon_cap: float, delta: float | None, relation: str | None,
    reason: str | None, actor: str,
) -> PersonBudgetView:
    """Create the per-person budget ``name`` or change its cap (audited; delta and relation are fixed
    at creation: a different value is refused with 409). Does not commit."""
    pb = session.scalar(select(PersonBudget).where(PersonBudget.name == name))
    if pb is None:
        if delta is None:
            raise DeltaRequired("a new person budget needs a delta")
        pb = ledger.open_person_budget(session, name, epsilon_cap=epsilon_cap, delta=delta,
                                       relation=relation or ledger.NEIGHBOURING_RELATION, actor=actor, reason=reason)
        return _person_view(session, pb)
    fixed = {"delta": (delta, pb.delta), "neighbouring_relation": (relation, pb.relation)}
    changed = {k: v for k, v in fixed.items() if v[0] is not None and v[0] != v[1]}
    if changed:
        raise PersonBudgetFixed(f"person budget {name!r} exists; its {', '.join(changed)} cannot change "
                                "(fixed at creation)", details={"person_budget": name, **{k: v[1] for k, v in changed.items()}})
    return _person_view(session, ledger.change_person_cap(session, name=name, new_cap=epsilon_cap, reason=reason,
                                                          actor=actor))


def change_cap(session: Session, *, dataset: str, new_cap: float, reason: str | None, actor: str) -> BudgetView:
    """Change the epsilon cap (audited in the ledger). Does not commit."""
    ds = get_dataset(session, dataset)
    ledger.record_cap_change(session, dataset=ds, new_cap=new_cap, reason=reason, actor=actor)
    return get_budget(session, dataset=dataset)


def list_ledger(session: Session, *, dataset: str, offset: int = 0, limit: int = 100) -> tuple[list[LedgerEntry], int]:
    """One page of the data set's ledger entries in sequence order, and the total count."""
    require_valid_page(offset, limit)
    ds = get_dataset(session, dataset)
    acct = _account(session, ds)
    total = session.scalar(select(func.count()).select_from(LedgerEntry).where(LedgerEntry.account_id == acct.id)) or 0
    rows = list(
        session.scalars(
            select(LedgerEntry).where(LedgerEntry.account_id == acct.id).order_by(LedgerEntry.seq).offset(offset).limit(limit)
        )
    )
    return rows, int(total)


def ledger_entry_out(entry: LedgerEntry) -> LedgerEntryOut:
    """The public view of one entry, including its event tree and parameters."""
    return LedgerEntryOut(
        seq=entry.seq,
        kind=entry.kind,
        run_id=entry.run_id,
        actor=entry.actor,
        created_at=datetime.fromisoformat(entry.created_at),  # stored as ISO-8601 text (hashed)
        event=entry.event,
        parameters=entry.parameters,
        epsilon=None if entry.epsilon is None else ledger.round_up(entry.epsilon),
        spent_epsilon_rdp=ledger.round_up(entry.spent_rdp),
        spent_epsilon_pld=None if entry.spent_pld is None else ledger.round_up(entry.spent_pld),
        epsilon_cap=entry.epsilon_cap,
        delta=entry.delta,
        reason=entry.reason,
        prev_hash=entry.prev_hash,
        hash=entry.hash,
    )


def verify_ledger(session: Session, *, dataset: str, recompute_spend: bool = False) -> dict[str, Any]:
    """Check the data set's hash chain (and optionally every stored spend) end to end."""
    ds = get_dataset(session, dataset)
    check = ledger.verify_chain(session, _account(session, ds).id, recompute_spend=recompute_spend)
    return {"dataset": ds.name, "ok": check.ok, "n_entries": check.n_entries, "bad_seq": check.bad_seq, "reason": check.reason}


def verify_all(session: Session, *, dataset: str | None = None) -> list[dict[str, Any]]:
    """Replay every ledger (or ``dataset``'s) and check its hash chain, every stored spend and its
    stored composed state; then every person budget's (or ``dataset``'s) stored state. One result
    per account and per person budget."""
    names = [dataset] if dataset is not None else list(session.scalars(select(Dataset.name).order_by(Dataset.name)))
    out = [verify_ledger(session, dataset=name, recompute_spend=True) for name in names]
    if dataset is not None:
        budgets = [_account(session, get_dataset(session, dataset)).person_budget]
    else:
        budgets = list(session.scalars(select(PersonBudget).order_by(PersonBudget.name)))
    for pb in budgets:
        check = ledger.verify_person_budget(session, pb)
        out.append({"person_budget": pb.name, "ok": check.ok, "n_entries": check.n_entries, "reason": check.reason})
    return out
