"""Budget service: data sets and their privacy budget (view, cap changes, ledger listing)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app import ledger
from app.config import Settings
from app.core.privacy.accounting import event_from_json
from app.core.privacy.blocks import UNIT_LABELS, USER
from app.db.models import BudgetAccount, Dataset, LedgerEntry, PersonBudget, PrivacyBlock, utcnow
from app.db.stores import blocks as block_store
from app.db.stores import budget as budget_store
from app.errors import DeltaRequired, InvalidDatasetName, InvalidRatingRange, PersonBudgetFixed
from app.schemas.admin import LedgerEntryOut
from app.schemas.common import require_valid_page
from app.services.catalog import get_dataset  # one definition; re-exported for the training services

__all__ = [
    "BudgetView",
    "PersonBudgetView",
    "BlockView",
    "list_blocks",
    "payable_blocks",
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
    privacy_unit: str = USER  # every epsilon above is per this unit (UNIT_LABELS)
    privacy_unit_label: str = UNIT_LABELS[USER]


@dataclass(frozen=True)
class BlockView:
    """One privacy block (a cohort's account under a data set's or a person budget's cap); epsilons
    rounded conservatively."""

    cohort: str
    epsilon_cap: float
    delta: float
    spent_epsilon_rdp: float
    spent_epsilon_pld: float | None
    remaining_epsilon: float
    n_runs: int
    privacy_unit: str = USER
    privacy_unit_label: str = UNIT_LABELS[USER]


@dataclass(frozen=True)
class BudgetView:
    """A data set's budget; epsilons rounded conservatively (spent up, remaining down). Spent is the
    most spent privacy block's (the loss of the users who lost most), remaining the least over every
    cap that applies (``binding_cap`` names it); ``n_blocks`` / ``current_block`` say where new
    users are charged (:func:`list_blocks` lists them)."""

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
    n_blocks: int = 0  # opened privacy blocks of the data set (legacy included)
    current_block: str | None = None  # the cohort users joining now belong to
    privacy_unit: str = USER  # the data set's unit, declared at creation: every epsilon above is per unit
    privacy_unit_label: str = UNIT_LABELS[USER]  # "per user" / "per user per period"


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
    privacy_unit: str = USER,
) -> Dataset:
    """Return the data set ``name``, creating it with its budget account (under ``relation``, counting
    against the per-person budget ``person_budget``, whose unit must be ``privacy_unit``) if missing."""
    ds = budget_store.find_dataset(session, name)
    if ds is not None:
        return ds
    if not name or len(name) > 64:
        raise InvalidDatasetName("a data set name must have 1 to 64 characters")
    if not rating_min < rating_max:
        raise InvalidRatingRange("rating_min must be below rating_max")
    ds = budget_store.add_dataset(session, Dataset(name=name, rating_min=float(rating_min),
                                                   rating_max=float(rating_max), description=description,
                                                   privacy_unit=privacy_unit))
    ledger.open_account(session, ds, epsilon_cap=epsilon_cap, delta=delta, actor=actor, relation=relation,
                        person_budget=person_budget)
    return ds


def bootstrap(session: Session, settings: Settings) -> Dataset:
    """Write the block calendar (the deployment's block period from now) and create the default data
    set (and budget account) from settings when missing."""
    s = settings
    block_store.ensure_calendar(session, s.privacy_block_period, utcnow())
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
    """Cap, delta, spent (RDP and PLD: the most spent block's), remaining under every cap and run
    counts of a data set (read from the stored composed states: no composition)."""
    ds = get_dataset(session, dataset)
    acct = _account(session, ds)
    spent_rdp, spent_pld = _most_spent(session, acct)
    n_local = budget_store.entry_count(session, acct.id, "local")
    rep = ledger.spent(session, acct)
    own_remaining = ledger.remaining(acct.epsilon_cap, spent_rdp)
    person = _person_view(session, acct.person_budget)
    binding = "dataset" if own_remaining <= person.remaining_epsilon else "person_budget"
    counts = budget_store.run_counts(session, ds.id)
    cal = block_store.calendar(session)
    return BudgetView(
        dataset=ds.name,
        epsilon_cap=acct.epsilon_cap,
        delta=acct.delta,
        accountant=acct.accountant,
        spent_epsilon_rdp=ledger.round_up(spent_rdp),
        spent_epsilon_pld=ledger.round_up(spent_pld),
        remaining_epsilon=min(own_remaining, person.remaining_epsilon),
        dataset_remaining_epsilon=own_remaining,
        binding_cap=binding,
        runs={k: int(counts.get(k, 0)) for k in ("queued", "running", "succeeded", "failed")},
        n_entries=budget_store.entry_count(session, acct.id),
        n_charged_runs=rep.n_events - n_local,
        n_local_guarantees=n_local,
        neighbouring_relation=ledger.account_relation(acct).value,
        neighbouring_relations=ledger.charged_relations(session, acct.id),
        person_budget=person,
        n_blocks=len(block_store.blocks_of(session, ledger.block_owner(acct))),
        current_block=ledger.block_calendar(session, utcnow())[-1] if cal is not None else None,
        privacy_unit=ds.privacy_unit,
        privacy_unit_label=UNIT_LABELS[ds.privacy_unit],
    )


def _most_spent(session: Session, row: BudgetAccount | PersonBudget) -> tuple[float, float]:
    """(RDP, PLD) epsilon of the most spent opened block of ``row`` (0 when none is open)."""
    reports = [ledger.block_spent(b, row.delta) for b in block_store.blocks_of(session, ledger.block_owner(row)).values()]
    worst = max(reports, key=lambda r: r.epsilon_rdp, default=None)
    return (0.0, 0.0) if worst is None else (worst.epsilon_rdp, worst.epsilon_pld)


def payable_blocks(session: Session, *, dataset: str, now: datetime | None = None,
                   read_current: bool = True) -> tuple[int, int]:
    """(blocks that could pay one more run like the data set's latest, blocks in the calendar): from
    the ledger and the calendar only. With no run yet, every block counts as payable; without
    ``read_current`` the still-open current block is not counted as payable."""
    ds = get_dataset(session, dataset)
    last = budget_store.last_reservation(session, _account(session, ds).id)
    if last is None or last.event is None:
        cal = block_store.calendar(session)
        n = len(ledger.block_calendar(session, now or utcnow())) if cal is not None else 0
        return n, n
    payable, n_blocks = ledger.payable_cohorts(session, ds, event_from_json(last.event), last.parameters, now,
                                               read_current)
    return len(payable), n_blocks


def _person_view(session: Session, pb: PersonBudget) -> PersonBudgetView:
    spent_rdp, spent_pld = _most_spent(session, pb)
    return PersonBudgetView(
        name=pb.name,
        epsilon_cap=pb.epsilon_cap,
        delta=pb.delta,
        neighbouring_relation=pb.relation,
        spent_epsilon_rdp=ledger.round_up(spent_rdp),
        spent_epsilon_pld=ledger.round_up(spent_pld),
        remaining_epsilon=ledger.remaining(pb.epsilon_cap, spent_rdp),
        datasets=budget_store.member_names(session, pb.id),
        history=[{"at": e.created_at, "actor": e.actor, "old_cap": e.old_cap, "new_cap": e.new_cap,
                  "reason": e.reason, "seq": e.seq, "hash": e.hash}
                 for e in ledger.person_budget_entries(session, pb.id)],
        privacy_unit=pb.privacy_unit,
        privacy_unit_label=UNIT_LABELS[pb.privacy_unit],
    )


def list_blocks(session: Session, *, dataset: str | None = None, person_budget: str | None = None,
                offset: int = 0, limit: int = 100) -> tuple[list[BlockView], int]:
    """One page of the privacy blocks of a data set (or of a person budget), the current period first,
    ``legacy`` last, and their count."""
    require_valid_page(offset, limit)
    row: BudgetAccount | PersonBudget = (ledger.person_budget_named(session, person_budget) if person_budget is not None
                                         else _account(session, get_dataset(session, dataset or "")))
    blocks, total = budget_store.blocks_page(session, ledger.block_owner(row), offset, limit)
    return [_block_view(b, row) for b in blocks], total


def _block_view(block: PrivacyBlock, row: BudgetAccount | PersonBudget) -> BlockView:
    rep = ledger.block_spent(block, row.delta)
    return BlockView(cohort=block.cohort, epsilon_cap=row.epsilon_cap, delta=row.delta,
                     spent_epsilon_rdp=ledger.round_up(rep.epsilon_rdp),
                     spent_epsilon_pld=None if not math.isfinite(rep.epsilon_pld) else ledger.round_up(rep.epsilon_pld),
                     remaining_epsilon=ledger.remaining(row.epsilon_cap, rep.epsilon_rdp), n_runs=block.n_runs,
                     privacy_unit=_unit_of(row), privacy_unit_label=UNIT_LABELS[_unit_of(row)])


def _unit_of(row: BudgetAccount | PersonBudget) -> str:
    return row.privacy_unit if isinstance(row, PersonBudget) else row.dataset.privacy_unit


def get_person_budget(session: Session, *, name: str) -> PersonBudgetView:
    """A per-person budget: cap, delta, relation, composed spend over its data sets, cap history."""
    return _person_view(session, ledger.person_budget_named(session, name))


def put_person_budget(
    session: Session, *, name: str, epsilon_cap: float, delta: float | None, relation: str | None,
    reason: str | None, actor: str, privacy_unit: str | None = None,
) -> PersonBudgetView:
    """Create the per-person budget ``name`` or change its cap (audited; delta, relation and privacy
    unit are fixed at creation: a different value is refused with 409). Does not commit."""
    pb = budget_store.find_person_budget(session, name)
    if pb is None:
        if delta is None:
            raise DeltaRequired("a new person budget needs a delta")
        pb = ledger.open_person_budget(session, name, epsilon_cap=epsilon_cap, delta=delta,
                                       relation=relation or ledger.NEIGHBOURING_RELATION, actor=actor, reason=reason,
                                       privacy_unit=privacy_unit or USER)
        return _person_view(session, pb)
    fixed = {"delta": (delta, pb.delta), "neighbouring_relation": (relation, pb.relation),
             "privacy_unit": (privacy_unit, pb.privacy_unit)}
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
    return budget_store.ledger_page(session, _account(session, ds).id, offset, limit)


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
    names = [dataset] if dataset is not None else budget_store.dataset_names(session)
    out = [verify_ledger(session, dataset=name, recompute_spend=True) for name in names]
    if dataset is not None:
        budgets = [_account(session, get_dataset(session, dataset)).person_budget]
    else:
        budgets = budget_store.person_budgets(session)
    for pb in budgets:
        check = ledger.verify_person_budget(session, pb)
        out.append({"person_budget": pb.name, "ok": check.ok, "n_entries": check.n_entries, "reason": check.reason})
    owners = {ledger.block_owner(_account(session, get_dataset(session, name))) for name in names}
    owners |= {ledger.block_owner(pb) for pb in budgets}
    for owner, cohort, check in ledger.verify_blocks(session):
        if owner in owners:
            out.append({"block": f"{owner}/{cohort}", "ok": check.ok, "n_entries": check.n_entries,
                        "reason": check.reason})
    return out
