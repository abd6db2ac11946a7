"""The persisted privacy ledger: reserve -> commit -> (refund), hash-chained, append-only.

Contract:

* ``reserve`` runs inside the caller's transaction and first locks the budget account row
  (``SELECT ... FOR UPDATE`` on PostgreSQL; on SQLite every transaction is ``BEGIN IMMEDIATE``,
  see ``app.db.session``), then composes the account's stored *composed state* (the RDP curve of
  every non-refunded charge, :mod:`app.core.privacy.composition`) with the new event and refuses
  (``BudgetExceeded``) when the composed epsilon at the account's delta would exceed the cap. The
  state is updated in the same transaction as the entry, so a charge costs the same after ten
  runs as after ten thousand; ``verify_chain`` replays the entries and checks it. A reservation
  counts as spent from the moment it is committed (fail closed: a vanished worker's reservation
  stays spent).
* One reservation per training run (idempotency key = run id): a redelivered task or a repeated
  request returns the existing entry and never charges twice.
* ``refund`` is allowed only for a failed run that persisted no output.
* Each entry stores the dp_accounting event (``event_to_json``), the parameters that give it
  meaning, the actor and the run; ``hash = sha256(canonical JSON(content) || prev_hash)``.
* Reported epsilons are rounded conservatively: spent up, remaining down.
* A ``local`` entry (``record_local_guarantee``) charges a guarantee given at ingestion, e.g.
  randomised response on votes: composed into the spend like a reservation, never refunded.
* One account, one relation (``BudgetAccount.relation``, default add/remove one user): an
  entry's guarantee (``parameters["neighbouring_relation"]``) must imply it, else the entry is
  refused (409 ``relation_not_implied``); an add/remove event charged to a weaker account is
  converted by group privacy and the converted event is stored as ``parameters["charged_event"]``
  (``event`` stays the event as released, which the worker checks against its releases). The
  conversion is a function of the entry's guarantee and the account's relation, so the stored
  state composes the converted events (migration 0010 computed it for ledgers written before).
* A person, not a data set, is the unit: every account names a per-person budget
  (``PersonBudget``, ``all`` by default), which keeps its own composed state of the charged events
  of every account of that budget (converted to its relation); a charge composes it with the new
  event and is refused
  (``PersonBudgetExceeded``) above its cap, in the same transaction: the data set's account is
  locked first, then the person budget (``SELECT ... FOR NO KEY UPDATE`` on PostgreSQL; SQLite's
  write lock serialises everything), always in that order.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from dp_accounting import dp_event
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.privacy.accounting import (
    DP_ACCOUNTING_VERSION,
    GROUP_PRIVACY_NOTE,
    NEIGHBOURING_RELATION,
    Relation,
    event_from_json,
    event_to_json,
    event_under,
    parse_relation,
    relation_implies,
)
from app.core.privacy.blocks import LEGACY, PRIVACY_UNITS, USER, cohort_order, cohorts_until
from app.core.privacy.composition import Charge, ComposedState, affordable_runs, charge
from app.db.models import BudgetAccount, Dataset, LedgerEntry, PersonBudget, PersonBudgetEntry, PrivacyBlock, utcnow
from app.db.session import is_postgres
from app.db.stores import blocks as block_store
from app.errors import (
    BudgetExceeded,
    CapChangeRefused,
    InvalidDelta,
    InvalidEpsilonCap,
    InvalidPersonBudgetName,
    InvalidRelation,
    NoBudgetAccount,
    NoReservation,
    PersonBudgetExceeded,
    PersonBudgetExists,
    PersonBudgetMissing,
    PrivacyUnitMismatch,
    ReasonRequired,
    RelationRefused,
    ReservationMismatch,
    RunPublished,
    RunRefunded,
    UnknownPersonBudget,
)

__all__ = [
    "GENESIS_HASH",
    "REPORT_PLACES",
    "round_up",
    "round_down",
    "canonical_json",
    "entry_content",
    "compute_hash",
    "lock_account",
    "account_for",
    "open_account",
    "charged_event",
    "recorded_charge",
    "account_relation",
    "DEFAULT_PERSON_BUDGET",
    "person_budget_named",
    "open_person_budget",
    "lock_person_budget",
    "person_state",
    "person_spent",
    "account_state",
    "replay",
    "change_person_cap",
    "spent",
    "SpentReport",
    "reserve",
    "ChargePreview",
    "preview_charge",
    "commit",
    "refund",
    "record_cap_change",
    "record_local_guarantee",
    "CHARGED_KINDS",
    "reservation_for",
    "ChainCheck",
    "verify_chain",
    "verify_person_budget",
    "DEFAULT_BLOCK_PERIOD",
    "block_calendar",
    "open_blocks",
    "select_cohorts",
    "entry_cohorts",
    "blocks_spent",
    "block_spent",
    "block_owner",
    "current_block_spent",
    "payable_cohorts",
    "BlockRoom",
    "block_room",
    "cohorts_with_room",
    "verify_blocks",
    "person_budget_entries",
    "person_entry_content",
    "verify_person_chain",
]

GENESIS_HASH = "0" * 64
REPORT_PLACES = 6
# Entries whose event counts towards the spend: run reservations (unless refunded) and local
# guarantees (randomisation at ingestion; never refunded: the randomised bits are stored).
CHARGED_KINDS = ("reservation", "local")
# The per-person budget every data set joins unless it names another; created by migration 0004
# (or here, on a schema built without it) with these figures, which the admin then sets.
DEFAULT_PERSON_BUDGET = "all"
DEFAULT_PERSON_CAP = 10.0
DEFAULT_PERSON_DELTA = 1e-6
# the block period written to the calendar when nothing set it before (the deployment's setting,
# app.config.Settings.privacy_block_period, is written at bootstrap)
DEFAULT_BLOCK_PERIOD = "month"


# ----------------------------------------------------------------------------- rounding
def round_up(x: float, places: int = REPORT_PLACES) -> float:
    """Smallest ``places``-decimal number >= ``x`` (exact, via the float's binary value)."""
    return float(Decimal(x).quantize(Decimal(1).scaleb(-places), rounding=ROUND_CEILING))


def round_down(x: float, places: int = REPORT_PLACES) -> float:
    """Largest ``places``-decimal number <= ``x``."""
    return float(Decimal(x).quantize(Decimal(1).scaleb(-places), rounding=ROUND_FLOOR))


def remaining(cap: float, spent_epsilon: float) -> float:
    """``cap - spent`` computed exactly and rounded down, never below 0."""
    exact = Decimal(cap) - Decimal(spent_epsilon)
    return max(0.0, float(exact.quantize(Decimal(1).scaleb(-REPORT_PLACES), rounding=ROUND_FLOOR)))


# ----------------------------------------------------------------------------- hashing
def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, no NaN/inf."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def entry_content(entry: LedgerEntry) -> dict[str, Any]:
    """Everything an entry's hash covers (all columns but ``id`` and the hashes)."""
    return {
        "account_id": entry.account_id,
        "seq": entry.seq,
        "kind": entry.kind,
        "run_id": entry.run_id,
        "actor": entry.actor,
        "event": entry.event,
        "parameters": entry.parameters,
        "epsilon": entry.epsilon,
        "spent_rdp": entry.spent_rdp,
        "spent_pld": entry.spent_pld,
        "epsilon_cap": entry.epsilon_cap,
        "delta": entry.delta,
        "reason": entry.reason,
        "created_at": entry.created_at,
    }


def compute_hash(content: Mapping[str, Any], prev_hash: str) -> str:
    """``sha256(canonical_json(content) || prev_hash)`` as hex."""
    return hashlib.sha256(canonical_json(content).encode("utf-8") + prev_hash.encode("ascii")).hexdigest()


# ----------------------------------------------------------------------------- accounts
def account_for(session: Session, dataset_id: int) -> BudgetAccount:
    """The budget account of a data set (no lock)."""
    acct = session.scalar(select(BudgetAccount).where(BudgetAccount.dataset_id == dataset_id))
    if acct is None:
        raise NoBudgetAccount(f"data set {dataset_id} has no budget account")
    return acct


def lock_account(session: Session, dataset_id: int) -> BudgetAccount:
    """Lock and return the budget account row for the rest of the transaction.

    PostgreSQL: ``SELECT ... FOR UPDATE``. SQLite: the transaction already holds the database
    write lock (``BEGIN IMMEDIATE``), which serialises all ledger writers.
    """
    stmt = select(BudgetAccount).where(BudgetAccount.dataset_id == dataset_id)
    if is_postgres(session):
        stmt = stmt.with_for_update()
    acct = session.execute(stmt.execution_options(populate_existing=True)).scalar_one_or_none()
    if acct is None:
        raise NoBudgetAccount(f"data set {dataset_id} has no budget account")
    return acct


def _last_entry(session: Session, account_id: int) -> LedgerEntry | None:
    return session.scalar(
        select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.seq.desc()).limit(1)
    )


def _append(session: Session, acct: BudgetAccount, **fields: Any) -> LedgerEntry:
    """Append one hash-chained entry (the account must be locked by the caller)."""
    last = _last_entry(session, acct.id)
    entry = LedgerEntry(
        account_id=acct.id,
        seq=(last.seq + 1) if last else 1,
        prev_hash=last.hash if last else GENESIS_HASH,
        created_at=utcnow().isoformat(timespec="microseconds"),
        epsilon_cap=acct.epsilon_cap,
        delta=acct.delta,
        **{"parameters": {}, "event": None, "epsilon": None, "reason": None, "run_id": None, **fields},
    )
    entry.hash = compute_hash(entry_content(entry), entry.prev_hash)
    session.add(entry)
    session.flush()
    return entry


def open_account(
    session: Session, dataset: Dataset, *, epsilon_cap: float, delta: float, actor: str, accountant: str = "rdp",
    relation: Relation | str = Relation.ADD_OR_REMOVE_ONE_USER, person_budget: str = DEFAULT_PERSON_BUDGET,
) -> BudgetAccount:
    """Create the budget account of ``dataset`` and its first ledger entry (kind ``open``) under
    ``relation``, the one neighbouring relation all of its numbers hold under, counting against
    the per-person budget ``person_budget`` (whose relation ``relation`` must imply)."""
    relation = _parse_or_invalid(relation)
    if not (math.isfinite(epsilon_cap) and epsilon_cap > 0):
        raise InvalidEpsilonCap("epsilon cap must be a finite number > 0")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise InvalidDelta("delta must lie strictly between 0 and 1")
    try:
        pb = person_budget_named(session, person_budget)
    except UnknownPersonBudget as exc:  # a reference in the request body, not the addressed resource
        raise PersonBudgetMissing(f"{exc.message}; create it first (PUT /v1/admin/person-budgets/{{name}})",
                             person_budget=person_budget) from exc
    if not relation_implies(relation, parse_relation(pb.relation)):
        raise RelationRefused(
            f"person budget {pb.name!r} accounts under {pb.relation}; a data set under {relation.value} "
            "does not imply it (name a person budget with a relation its data sets imply)",
            dataset=dataset.name, person_budget=pb.name, account_relation=pb.relation, event_relation=relation.value)
    unit = dataset.privacy_unit or USER
    if pb.privacy_unit != unit:
        raise PrivacyUnitMismatch(
            f"person budget {pb.name!r} holds data sets whose privacy unit is {pb.privacy_unit!r}; a data set of "
            f"unit {unit!r} needs a person budget of that unit (PUT /v1/admin/person-budgets/{{name}} with "
            f"privacy_unit {unit!r})", dataset=dataset.name, person_budget=pb.name,
            person_budget_unit=pb.privacy_unit, privacy_unit=unit)
    acct = BudgetAccount(dataset_id=dataset.id, epsilon_cap=float(epsilon_cap), delta=float(delta), accountant=accountant,
                         relation=relation.value, person_budget_id=pb.id,
                         composed_state={**ComposedState().to_json(), "epsilon_pld": 0.0})
    session.add(acct)
    session.flush()
    _append(
        session,
        acct,
        kind="open",
        actor=actor,
        parameters={"neighbouring_relation": relation.value, "person_budget": pb.name, "privacy_unit": unit},
        spent_rdp=0.0,
        spent_pld=0.0,
        reason="budget account opened",
    )
    return acct


def _parse_or_invalid(relation: object) -> Relation:
    try:
        return parse_relation(relation)
    except ValueError as exc:
        raise InvalidRelation(str(exc)) from exc


# ----------------------------------------------------------------------------- person budgets
def person_budget_named(session: Session, name: str = DEFAULT_PERSON_BUDGET) -> PersonBudget:
    """The per-person budget ``name`` (no lock); ``all`` is created with the defaults when missing."""
    pb = session.scalar(select(PersonBudget).where(PersonBudget.name == name))
    if pb is None and name == DEFAULT_PERSON_BUDGET:
        pb = open_person_budget(session, name, epsilon_cap=DEFAULT_PERSON_CAP, delta=DEFAULT_PERSON_DELTA,
                                relation=Relation.ADD_OR_REMOVE_ONE_USER, actor="system")
    if pb is None:
        raise UnknownPersonBudget(f"unknown person budget {name!r}", person_budget=name)
    return pb


def open_person_budget(
    session: Session, name: str, *, epsilon_cap: float, delta: float, relation: Relation | str, actor: str,
    reason: str | None = None, privacy_unit: str = USER,
) -> PersonBudget:
    """Create a per-person budget of ``privacy_unit`` (its data sets declare the same;
    ``PersonBudgetExists`` when ``name`` exists). Does not commit."""
    relation = _parse_or_invalid(relation)
    if privacy_unit not in PRIVACY_UNITS:
        raise ValueError(f"unknown privacy unit {privacy_unit!r}")
    if not name or len(name) > 64:
        raise InvalidPersonBudgetName("a person budget name must have 1 to 64 characters")
    if not (math.isfinite(epsilon_cap) and epsilon_cap > 0):
        raise InvalidEpsilonCap("epsilon cap must be a finite number > 0")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise InvalidDelta("delta must lie strictly between 0 and 1")
    if session.scalar(select(PersonBudget.id).where(PersonBudget.name == name)) is not None:
        raise PersonBudgetExists(f"person budget {name!r} exists", person_budget=name)
    pb = PersonBudget(name=name, epsilon_cap=float(epsilon_cap), delta=float(delta), relation=relation.value,
                      privacy_unit=privacy_unit, history=[], composed_state={**ComposedState().to_json(), "epsilon_pld": 0.0})
    session.add(pb)
    session.flush()
    _append_person_entry(session, pb, kind="open", actor=actor, old_cap=None, new_cap=float(epsilon_cap),
                         reason=reason or "created")
    return pb


def person_entry_content(entry: PersonBudgetEntry) -> dict[str, Any]:
    """Everything a person budget entry's hash covers (all columns but ``id`` and the hashes)."""
    return {"person_budget_id": entry.person_budget_id, "seq": entry.seq, "kind": entry.kind, "actor": entry.actor,
            "old_cap": entry.old_cap, "new_cap": entry.new_cap, "reason": entry.reason,
            "created_at": entry.created_at}


def person_budget_entries(session: Session, person_budget_id: int) -> list[PersonBudgetEntry]:
    """The person budget's chain (its opening and cap changes) in sequence order."""
    return list(session.scalars(select(PersonBudgetEntry).where(PersonBudgetEntry.person_budget_id == person_budget_id)
                                .order_by(PersonBudgetEntry.seq)))


def _append_person_entry(session: Session, pb: PersonBudget, *, kind: str, actor: str, old_cap: float | None,
                         new_cap: float, reason: str | None) -> PersonBudgetEntry:
    """Append one hash-chained entry to the person budget's chain (its row locked by the caller)."""
    last = session.scalar(select(PersonBudgetEntry).where(PersonBudgetEntry.person_budget_id == pb.id)
                          .order_by(PersonBudgetEntry.seq.desc()).limit(1))
    entry = PersonBudgetEntry(person_budget_id=pb.id, seq=(last.seq + 1) if last else 1,
                              prev_hash=last.hash if last else GENESIS_HASH, kind=kind, actor=actor, old_cap=old_cap,
                              new_cap=new_cap, reason=reason, created_at=utcnow().isoformat(timespec="microseconds"))
    entry.hash = compute_hash(person_entry_content(entry), entry.prev_hash)
    session.add(entry)
    session.flush()
    return entry


def verify_person_chain(session: Session, person_budget: PersonBudget) -> ChainCheck:
    """Recompute every hash of the person budget's chain, and check that it ends at its current cap."""
    entries = person_budget_entries(session, person_budget.id)
    prev = GENESIS_HASH
    for expected_seq, entry in enumerate(entries, start=1):
        if entry.seq != expected_seq:
            return ChainCheck(False, len(entries), entry.seq, f"sequence gap: expected {expected_seq}")
        if entry.prev_hash != prev or compute_hash(person_entry_content(entry), prev) != entry.hash:
            return ChainCheck(False, len(entries), entry.seq, "hash does not match the person budget chain")
        prev = entry.hash
    if entries and entries[-1].new_cap != person_budget.epsilon_cap:
        return ChainCheck(False, len(entries), None, "the person budget's cap differs from its chain's last entry")
    return ChainCheck(True, len(entries))


def lock_person_budget(session: Session, person_budget_id: int) -> PersonBudget:
    """Lock and return a person budget row (after the data set's account, never before).

    PostgreSQL: ``FOR NO KEY UPDATE`` (serialises charges of all its data sets without blocking
    the foreign-key share lock a new data set takes). SQLite: the write lock is already held.
    """
    stmt = select(PersonBudget).where(PersonBudget.id == person_budget_id)
    if is_postgres(session):
        stmt = stmt.with_for_update(key_share=True)
    return session.execute(stmt.execution_options(populate_existing=True)).scalar_one()


def _person_entries(session: Session, person_budget: PersonBudget) -> list[LedgerEntry]:
    """The charging entries (and refunds) of every account of ``person_budget``, in write order."""
    return list(session.scalars(
        select(LedgerEntry)
        .join(BudgetAccount, BudgetAccount.id == LedgerEntry.account_id)
        .where(BudgetAccount.person_budget_id == person_budget.id,
               LedgerEntry.kind.in_([*CHARGED_KINDS, "refund"]))
        .order_by(LedgerEntry.id)
    ))


def person_state(session: Session, person_budget: PersonBudget) -> ComposedState:
    """The stored composition of the person budget's charged events (replayed when none is stored)."""
    stored = ComposedState.from_json(person_budget.composed_state)
    if stored is not None:
        return stored
    return replay(_person_entries(session, person_budget), parse_relation(person_budget.relation))


def person_spent(session: Session, person_budget: PersonBudget) -> SpentReport:
    """The composed spend of a person budget at its delta, read from its stored state."""
    return _report(person_budget, person_state(session, person_budget), person_budget.delta)


def change_person_cap(
    session: Session, *, name: str, new_cap: float, reason: str | None, actor: str
) -> PersonBudget:
    """Change a person budget's cap (a hash-chained entry of its own chain); same rules as a data set's cap."""
    if not isinstance(new_cap, (int, float)) or not math.isfinite(new_cap) or new_cap <= 0:
        raise InvalidEpsilonCap("the new cap must be a finite number > 0")
    pb = lock_person_budget(session, person_budget_named(session, name).id)
    if new_cap > pb.epsilon_cap and not (reason and reason.strip()):
        raise ReasonRequired("raising the privacy budget cap requires a reason")
    current = blocks_spent(session, pb)  # the most spent block: every block has the cap
    if new_cap < current:
        raise CapChangeRefused(
            f"cannot lower the cap to {new_cap}: epsilon {round_up(current)} is already spent in a block",
            person_budget=pb.name, epsilon_cap=pb.epsilon_cap, requested_cap=float(new_cap),
            spent_epsilon=round_up(current))
    if new_cap != pb.epsilon_cap:
        _append_person_entry(session, pb, kind="cap_change", actor=actor, old_cap=pb.epsilon_cap,
                             new_cap=float(new_cap), reason=(reason or "").strip() or None)
        pb.epsilon_cap = float(new_cap)
        pb.updated_at = utcnow()
        session.flush()
    return pb


def _reported(epsilon: float) -> float:
    return round_up(epsilon) if math.isfinite(epsilon) else float("inf")


# ----------------------------------------------------------------------------- composed states
def replay(entries: Iterable[LedgerEntry], relation: Relation) -> ComposedState:
    """The composed state of ``entries`` (in order) charged under ``relation``: local guarantees and
    reservations added, a refunded reservation removed. ``entries`` need not be attached to a session."""
    state = ComposedState()
    reserved: dict[int | None, tuple[dp_event.DpEvent, str | None]] = {}
    for entry in entries:
        if entry.kind in CHARGED_KINDS:
            event, label = charged_event(entry, relation), _label(entry)
            if entry.kind == "reservation":
                reserved[entry.run_id] = (event, label)
            state = state.add(event, label)
        elif entry.kind == "refund" and entry.run_id in reserved:
            state = state.remove(*reserved.pop(entry.run_id))
    return state


def _label(entry: LedgerEntry) -> str | None:
    """What an entry counts under in a state's labels: its guarantee's relation when it costs anything."""
    return _entry_relation(entry).value if (entry.epsilon or 0.0) > 0 else None


def account_state(session: Session, account: BudgetAccount) -> ComposedState:
    """The stored composition of the account's charged events (replayed when none is stored)."""
    stored = ComposedState.from_json(account.composed_state)
    if stored is not None:
        return stored
    return replay(_entries(session, account.id, (*CHARGED_KINDS, "refund")), account_relation(account))


def _store_state(row: BudgetAccount | PersonBudget, state: ComposedState, delta: float) -> float:
    """Write ``state`` (and its PLD epsilon at ``delta``) on the locked ``row``; return that epsilon."""
    pld = state.epsilon_pld(delta)
    row.composed_state = {**state.to_json(), "epsilon_pld": pld if math.isfinite(pld) else None}
    return pld


def _report(row: BudgetAccount | PersonBudget, state: ComposedState, delta: float) -> SpentReport:
    cached = (row.composed_state or {}).get("epsilon_pld")
    stored = ComposedState.from_json(row.composed_state)
    pld = float(cached) if cached is not None and stored == state else state.epsilon_pld(delta)
    return SpentReport(state.epsilon_rdp(delta), pld, state.n_events)


# ----------------------------------------------------------------------------- spending
def _entries(session: Session, account_id: int, kinds: Sequence[str]) -> list[LedgerEntry]:
    return list(
        session.scalars(
            select(LedgerEntry)
            .where(LedgerEntry.account_id == account_id, LedgerEntry.kind.in_(list(kinds)))
            .order_by(LedgerEntry.seq)
        )
    )


def charged_event(entry: LedgerEntry, relation: Relation) -> dp_event.DpEvent:
    """The event ``entry`` charges to an account under ``relation``: its released event converted
    from the relation its guarantee was stated under (:func:`app.core.privacy.accounting.event_under`)."""
    return event_under(event_from_json(_released_event(entry)), _entry_relation(entry), relation)


def recorded_charge(entry: LedgerEntry) -> dp_event.DpEvent:
    """The event as it was charged when the entry was written (what its stored spend composed)."""
    return event_from_json(entry.parameters.get("charged_event") or _released_event(entry))


def _released_event(entry: LedgerEntry) -> dict[str, Any]:
    """The stored event of a charging entry (reservations and local guarantees always carry one)."""
    if entry.event is None:
        raise ValueError(f"ledger entry {entry.seq} ({entry.kind}) records no event")
    return entry.event


def charged_relations(session: Session, account_id: int) -> list[str]:
    """The distinct neighbouring relations of the entries that cost budget (non-zero, not refunded).

    The ledger composes every charged event into one spend; that figure protects users only in
    the weakest of these senses (e.g. randomised response hides vote values, not which items a
    user voted on), which the budget view shows next to it. Read from the stored state.
    """
    acct = session.get(BudgetAccount, account_id)
    if acct is None:
        raise NoBudgetAccount(f"no budget account {account_id}")
    return sorted(label for label, n in account_state(session, acct).label_counts().items() if n > 0)


def _entry_relation(entry: LedgerEntry) -> Relation:
    return parse_relation(entry.parameters.get("neighbouring_relation", NEIGHBOURING_RELATION))


def account_relation(account: BudgetAccount) -> Relation:
    """The account's declared relation."""
    return parse_relation(account.relation or NEIGHBOURING_RELATION)


@dataclass(frozen=True)
class SpentReport:
    """Composed spend of an account (exact floats; round for display with round_up)."""

    epsilon_rdp: float
    epsilon_pld: float
    n_events: int


def spent(session: Session, account: BudgetAccount, *, recompute: bool = False) -> SpentReport:
    """The account's composed spend: read from its stored state (constant time), or with
    ``recompute`` replayed from every charging entry of its ledger."""
    if recompute:
        state = replay(_entries(session, account.id, (*CHARGED_KINDS, "refund")), account_relation(account))
        return SpentReport(state.epsilon_rdp(account.delta), state.epsilon_pld(account.delta), state.n_events)
    return _report(account, account_state(session, account), account.delta)


def reservation_for(session: Session, run_id: int) -> LedgerEntry | None:
    """The reservation entry of a training run, if any."""
    return session.scalar(select(LedgerEntry).where(LedgerEntry.run_id == run_id, LedgerEntry.kind == "reservation"))


def _run_entry(session: Session, run_id: int, kind: str) -> LedgerEntry | None:
    return session.scalar(select(LedgerEntry).where(LedgerEntry.run_id == run_id, LedgerEntry.kind == kind))


def base_parameters(relation: Relation | str = NEIGHBOURING_RELATION) -> dict[str, Any]:
    """Parameters every entry carries (neighbouring relation, library version)."""
    return {"neighbouring_relation": parse_relation(relation).value, "dp_accounting_version": DP_ACCOUNTING_VERSION}


def reserve(
    session: Session,
    *,
    dataset: Dataset,
    event: dp_event.DpEvent,
    parameters: Mapping[str, Any],
    actor: str,
    run_id: int,
    now: datetime | None = None,
    read_current: bool = True,
) -> LedgerEntry:
    """Reserve ``event`` for training run ``run_id`` against the data set's budget, on the blocks
    that can pay for it (:func:`select_cohorts`; ``now``: the clock, injectable; without
    ``read_current`` the still-open current period's block is not among them).

    Locks the account, composes its stored state with ``event`` (RDP at the account's delta; then
    the person budget's, locked after it) and appends a ``reservation`` entry, or raises
    ``BudgetExceeded``. Idempotent per run: an existing reservation is returned unchanged. The
    entry's ``epsilon`` is the run alone as charged to the account. Does not commit.
    """
    event_json = event_to_json(event)  # validates the event (and that it is serialisable)
    acct = lock_account(session, dataset.id)
    _guarantee(acct, dataset, parameters)  # refuses a relation the account cannot take
    if _run_entry(session, run_id, "refund") is not None:
        raise RunRefunded(f"training run {run_id} was refunded and cannot reserve again")
    existing = reservation_for(session, run_id)
    if existing is not None:
        if existing.event != event_json:
            raise ReservationMismatch(f"training run {run_id} already holds a reservation for a different event")
        return existing
    return _charge(session, acct, dataset, event, kind="reservation", run_id=run_id, actor=actor,
                   event_json=event_json, parameters=parameters, now=now, read_current=read_current)


def _charge(
    session: Session,
    acct: BudgetAccount,
    dataset: Dataset,
    event: dp_event.DpEvent,
    *,
    kind: str,
    actor: str,
    event_json: dict[str, Any],
    parameters: Mapping[str, Any],
    run_id: int | None = None,
    reason: str | None = None,
    now: datetime | None = None,
    read_current: bool = True,
) -> LedgerEntry:
    """Charge ``event`` to the blocks it reads (a reservation: the payable cohorts, chosen by
    :func:`select_cohorts`; a local guarantee: every block) of the account (locked by the caller)
    and of its person budget, by :func:`app.core.privacy.composition.charge`; keep the account's
    and the person budget's whole-history states beside them; append the entry naming the cohorts
    (``parameters["cohorts"]``, hashed with it); all in the caller's transaction.
    ``BudgetExceeded`` / ``PersonBudgetExceeded`` when no block can pay (a reservation) or some
    block cannot (a local guarantee); ``RelationRefused`` when the event's relation does not
    imply the account's."""
    guarantee = _guarantee(acct, dataset, parameters)
    account = account_relation(acct)
    person = lock_person_budget(session, acct.person_budget_id)
    own, personal = open_blocks(session, acct, person, now or utcnow())
    if not read_current and kind == "reservation":
        own, personal = _closed_only(own), _closed_only(personal)
    chosen = select_cohorts(acct, person, own, personal, event, guarantee, dataset=dataset.name,
                            every=(kind == "local"))
    result = _whole_charge(account_state(session, acct), event, guarantee, account, acct, dataset)
    person_result = _whole_charge(person_state(session, person), event, guarantee, parse_relation(person.relation),
                                  person, dataset)
    for cohort, block_charge, person_charge in chosen:
        _store_block(own[cohort], block_charge.state_after, acct.delta, kind)
        _store_block(personal[cohort], person_charge.state_after, person.delta, kind)
    relation_parameters: dict[str, Any] = {"neighbouring_relation": guarantee.value, "charged_relation": account.value}
    if result.converted:
        relation_parameters.update(charged_event=event_to_json(result.event), conversion=GROUP_PRIVACY_NOTE)
    total_pld = _store_state(acct, result.state_after, acct.delta)
    _store_state(person, person_result.state_after, person.delta)
    return _append(
        session,
        acct,
        kind=kind,
        run_id=run_id,
        actor=actor,
        event=event_json,
        parameters={**base_parameters(acct.relation), **dict(parameters), **relation_parameters,
                    "person_budget": person.name, "cohorts": [cohort for cohort, _, _ in chosen]},
        epsilon=result.epsilon_alone,
        spent_rdp=result.epsilon_after,
        spent_pld=total_pld,
        reason=reason,
    )


def _whole_charge(state: ComposedState, event: dp_event.DpEvent, guarantee: Relation, relation: Relation,
                  row: BudgetAccount | PersonBudget, dataset: Dataset) -> Charge:
    """The whole-history state of an account or person budget with ``event`` added: a record (every
    run of every cohort composed), not a cap: each block carries the cap."""
    try:
        return charge(state, event, guarantee=guarantee, account=relation, delta=row.delta, cap=math.inf,
                      label=guarantee.value)
    except ValueError as exc:
        raise RelationRefused(str(exc), dataset=dataset.name, account_relation=relation.value,
                              event_relation=guarantee.value) from exc


# ----------------------------------------------------------------------------- privacy blocks
def block_owner(row: BudgetAccount | PersonBudget) -> str:
    """The owner key of ``row``'s blocks (``account:<id>`` or ``person_budget:<id>``)."""
    return f"account:{row.id}" if isinstance(row, BudgetAccount) else f"person_budget:{row.id}"


def _local_state(session: Session, row: BudgetAccount | PersonBudget) -> ComposedState:
    """The composition of every local guarantee charged to ``row`` (what a newly opened block of it
    starts with: a guarantee given at ingestion covers every user, later ones included)."""
    if isinstance(row, BudgetAccount):
        entries = _entries(session, row.id, ("local",))
        return replay(entries, account_relation(row))
    return replay([e for e in _person_entries(session, row) if e.kind == "local"], parse_relation(row.relation))


def _open_missing(session: Session, row: BudgetAccount | PersonBudget, labels: Sequence[str]) -> dict[str, PrivacyBlock]:
    found = block_store.lock_blocks(session, block_owner(row))
    missing = [label for label in labels if label not in found]
    if missing:
        local = _local_state(session, row)
        stored = {**local.to_json(), "epsilon_pld": _finite_or_none(local.epsilon_pld(row.delta))}
        for label in missing:
            found[label] = block_store.add_block(
                session, owner=block_owner(row), cohort=label, composed_state=dict(stored),
                account_id=row.id if isinstance(row, BudgetAccount) else None,
                person_budget_id=row.id if isinstance(row, PersonBudget) else None)
    return found


def block_calendar(session: Session, now: datetime) -> list[str]:
    """Every block of the calendar at ``now`` (``legacy`` first, then each period up to ``now``'s),
    from the calendar row alone (written with the default period when missing)."""
    cal = block_store.ensure_calendar(session, DEFAULT_BLOCK_PERIOD, now)
    return cohorts_until(cal.start, now, cal.period)


def open_blocks(session: Session, acct: BudgetAccount, person: PersonBudget,
                now: datetime) -> tuple[dict[str, PrivacyBlock], dict[str, PrivacyBlock]]:
    """Lock the account's blocks, then the person budget's (both owners' rows locked by the caller,
    in that order), opening every block the calendar has at ``now`` that is not yet opened; a
    block opens with the state of the local guarantees already given. The set of blocks is a
    function of the calendar and ``now`` only."""
    labels = block_calendar(session, now)
    own = _open_missing(session, acct, labels)
    personal = _open_missing(session, person, labels)
    return ({label: own[label] for label in labels}, {label: personal[label] for label in labels})


def block_spent(block: PrivacyBlock, delta: float) -> SpentReport:
    """A block's composed spend at ``delta`` (its stored state; the PLD epsilon as stored)."""
    state = _block_state(block)
    cached = (block.composed_state or {}).get("epsilon_pld")
    pld = float(cached) if cached is not None else state.epsilon_pld(delta)
    return SpentReport(state.epsilon_rdp(delta), pld, state.n_events)


def _block_state(block: PrivacyBlock) -> ComposedState:
    state = ComposedState.from_json(block.composed_state)
    if state is None:
        raise RuntimeError(f"privacy block {block.owner}/{block.cohort} has no composed state on this RDP grid")
    return state


def select_cohorts(
    acct: BudgetAccount, person: PersonBudget, own: Mapping[str, PrivacyBlock], personal: Mapping[str, PrivacyBlock],
    event: dp_event.DpEvent, guarantee: Relation, *, dataset: str, every: bool = False,
) -> list[tuple[str, Charge, Charge]]:
    """The cohorts a charge of ``event`` reads, with each block's charge (data set's, person's).

    **Privacy argument (user-level blocks).** The neighbouring relation is add/remove one user u.
    Her data lives in exactly one cohort c (the public period of her first creation, kept past her
    deletion), and a run that reads cohorts C loads only ratings of users in C. A run with c not in
    C has the same output distribution with or without u (it never reads her rows), so u's loss is
    the composition of the releases charged to block c alone: the runs whose C held c and every
    local guarantee (charged to every block). Those runs, their events and their C are chosen
    adaptively, from earlier releases. At a fixed Renyi order a, the Renyi filter of Feldman &
    Zrnic (NeurIPS 2021, arXiv:2008.11193, Thm. 3.1) bounds such a composition by its budget B(a)
    provided the running sum of the a-RDP of the charged events never passes B(a), each event being
    chosen before it runs. The acceptance rule meets those conditions: (i) a run's event and its C
    are functions of public facts only, fixed before it reads anything: the stored block states,
    the calendar and ``now``, the data set's declarations and earlier releases, never the number
    of users or ratings in a block (this function reads nothing else); (ii) a block takes a charge
    only when its composed curve *with* the new event stays within its cap at its delta
    (:func:`app.core.privacy.composition.charge`), a reserved charge is never taken back once data
    was read, and a block refuses any charge that would pass its cap; (iii) the cap is fixed before
    the charges it bounds (a raised cap is a new, logged bound from then on). The cap is checked on
    the best order of the grid (epsilon at delta, Canonne-Kamath-Steinke arXiv:2004.00010, Prop.
    12), and the best order may change with the history: at each order a of the grid the history
    is an a-filter up to the first charge that passes that order's budget, so a union over the
    grid's orders bounds u's privacy-loss tail by |grid| * delta in the worst case (the bound the
    ledger states takes delta at the order that attains the minimum). Hence every user's loss over
    the service's whole life is at most her block's cap (under that caveat on delta), for the data
    set's account and for her person budget alike.

    **The ``user_period`` unit** (declared at creation by a data set and by its person budget, never
    mixed with ``user``). The relation is add/remove one unit (u, P): user u's ratings created in
    period P. A rating's period is the period of its creation time, written when it is first inserted
    and kept by every update (a deletion removes it from that period), so one unit's data lies in
    block P alone, and a run that reads periods C loads only ratings created in C
    (:mod:`app.db.loaders`). Inside the run each (u, P) is its own row (its own offset, sample,
    contribution bound, clip and solve), so every release's sensitivity is that of one row of the
    user-level analysis. The argument above then holds word for word with "cohort" read as "period
    of creation": each unit loses at most its block's cap. A person's whole history is the
    composition over the periods she rated in, which no cap bounds: that is the unit's stated limit.

    A reservation takes every block (data set's and person's for one cohort) that can pay, in
    cohort order; a local guarantee (``every``) takes all of them and is refused unless each can.
    ``BudgetExceeded`` / ``PersonBudgetExceeded`` (numbers of the current block) when none can."""
    chosen, refused = [], None
    for label in sorted(own, key=cohort_order):
        try:
            block_charge = charge(_block_state(own[label]), event, guarantee=guarantee, account=account_relation(acct),
                                  delta=acct.delta, cap=acct.epsilon_cap, label=guarantee.value)
            person_charge = charge(_block_state(personal[label]), event, guarantee=guarantee,
                                   account=parse_relation(person.relation), delta=person.delta,
                                   cap=person.epsilon_cap, label=guarantee.value)
        except ValueError as exc:
            raise RelationRefused(str(exc), dataset=dataset, account_relation=acct.relation,
                                  event_relation=guarantee.value) from exc
        if block_charge.fits and person_charge.fits:
            chosen.append((label, block_charge, person_charge))
        else:
            refused = (label, block_charge, person_charge)
            if every:
                break
    if refused is not None and (every or not chosen):
        _, block_charge, person_charge = refused
        if block_charge.fits:
            raise PersonBudgetExceeded(
                dataset=dataset, person_budget=person.name, prior_spent_epsilon=round_up(person_charge.epsilon_before),
                requested_epsilon=round_up(person_charge.epsilon_alone),
                would_spend_epsilon=_reported(person_charge.epsilon_after), epsilon_cap=person.epsilon_cap,
                delta=person.delta)
        raise BudgetExceeded(
            dataset=dataset, prior_spent_epsilon=round_up(block_charge.epsilon_before),
            requested_epsilon=round_up(block_charge.epsilon_alone),
            would_spend_epsilon=_reported(block_charge.epsilon_after), epsilon_cap=acct.epsilon_cap, delta=acct.delta)
    return chosen


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _store_block(block: PrivacyBlock, state: ComposedState, delta: float, kind: str) -> None:
    block.composed_state = {**state.to_json(), "epsilon_pld": _finite_or_none(state.epsilon_pld(delta))}
    if kind == "reservation":
        block.n_runs += 1


def entry_cohorts(entry: LedgerEntry) -> list[str] | None:
    """The cohorts a charging entry charged: every block for a local guarantee (None), the recorded
    ones for a reservation (``legacy`` for one written before blocks existed)."""
    if entry.kind == "local":
        return None
    return list(entry.parameters.get("cohorts", [LEGACY]))


def blocks_spent(session: Session, row: BudgetAccount | PersonBudget) -> float:
    """The largest composed epsilon of ``row``'s opened blocks at its delta (0 when none is open)."""
    states = [_block_state(b) for b in block_store.blocks_of(session, block_owner(row)).values()]
    return max((s.epsilon_rdp(row.delta) for s in states), default=0.0)


def verify_blocks(session: Session) -> list[tuple[str, str, ChainCheck]]:
    """Replay every opened block from its owner's charging entries (local guarantees, and the
    reservations naming its cohort, less their refunds) and check its stored state: equal to the
    replay and within its cap. ``(owner, cohort, check)`` per block."""
    out = []
    cache: dict[str, tuple[list[LedgerEntry], Relation, float, float]] = {}
    for block in block_store.all_blocks(session):
        if block.owner not in cache:
            cache[block.owner] = _owner_entries(session, block)
        entries, relation, delta, cap = cache[block.owner]
        mine = [e for e in entries if e.kind == "refund" or (c := entry_cohorts(e)) is None or block.cohort in c]
        replayed = replay(mine, relation)
        problem = _state_problem(block, replayed, delta, cap)
        out.append((block.owner, block.cohort, ChainCheck(problem is None, len(mine), None, problem)))
    return out


def _owner_entries(session: Session, block: PrivacyBlock) -> tuple[list[LedgerEntry], Relation, float, float]:
    if block.account_id is not None:
        acct = session.get(BudgetAccount, block.account_id)
        if acct is None:
            raise NoBudgetAccount(f"no budget account {block.account_id}")
        return (_entries(session, acct.id, (*CHARGED_KINDS, "refund")), account_relation(acct), acct.delta,
                acct.epsilon_cap)
    pb = session.get(PersonBudget, block.person_budget_id)
    if pb is None:
        raise UnknownPersonBudget(f"no person budget {block.person_budget_id}")
    return _person_entries(session, pb), parse_relation(pb.relation), pb.delta, pb.epsilon_cap


@dataclass(frozen=True)
class ChargePreview:
    """What charging an event would do to a data set's account and to its person budget (nothing
    locked, nothing written): the projection's view of exactly the computation a charge makes."""

    account: Charge
    person: Charge
    person_budget: PersonBudget
    account_state: ComposedState
    person_state: ComposedState


def preview_charge(session: Session, dataset: Dataset, event: dp_event.DpEvent,
                   parameters: Mapping[str, Any]) -> ChargePreview:
    """:func:`app.core.privacy.composition.charge` on the current block (the cohort users join now)
    of the data set's account and of its person budget, from their stored states (a block not yet
    opened: the state it would open with), as :func:`reserve` would run it there
    (``RelationRefused`` likewise). Nothing is written."""
    acct = account_for(session, dataset.id)
    guarantee = _guarantee(acct, dataset, parameters)
    pb = acct.person_budget
    own, person = _current_block_state(session, acct), _current_block_state(session, pb)
    try:
        account_charge = charge(own, event, guarantee=guarantee, account=account_relation(acct),
                                delta=acct.delta, cap=acct.epsilon_cap)
        person_charge = charge(person, event, guarantee=guarantee, account=parse_relation(pb.relation),
                               delta=pb.delta, cap=pb.epsilon_cap)
    except ValueError as exc:
        raise RelationRefused(str(exc), dataset=dataset.name, account_relation=acct.relation,
                              event_relation=guarantee.value) from exc
    return ChargePreview(account_charge, person_charge, pb, own, person)


def _current_block_state(session: Session, row: BudgetAccount | PersonBudget,
                         now: datetime | None = None) -> ComposedState:
    cal = block_store.calendar(session)
    label = cohorts_until(cal.start, now or utcnow(), cal.period)[-1] if cal is not None else None
    block = block_store.blocks_of(session, block_owner(row)).get(label) if label is not None else None
    return _block_state(block) if block is not None else _local_state(session, row)


def _calendar_blocks(session: Session, row: BudgetAccount | PersonBudget, labels: Sequence[str]) -> dict[str, PrivacyBlock]:
    """``row``'s blocks for ``labels``: the opened ones, and for the others transient rows (never
    added to the session) holding the state they would open with."""
    found = block_store.blocks_of(session, block_owner(row))
    missing = [label for label in labels if label not in found]
    if missing:
        local = _local_state(session, row).to_json()
        for label in missing:
            found[label] = PrivacyBlock(owner=block_owner(row), cohort=label, composed_state=local, n_runs=0)
    return {label: found[label] for label in labels}


def _closed_only(blocks: Mapping[str, PrivacyBlock]) -> dict[str, PrivacyBlock]:
    """``blocks`` (a calendar's, in cohort order) less the still-open current period's: the last
    label, unless it is ``legacy`` (calendar facts only)."""
    labels = sorted(blocks, key=cohort_order)
    current = labels[-1] if labels and labels[-1] != LEGACY else None
    return {label: blocks[label] for label in labels if label != current}


def payable_cohorts(session: Session, dataset: Dataset, event: dp_event.DpEvent, parameters: Mapping[str, Any],
                    now: datetime | None = None, read_current: bool = True) -> tuple[list[str], int]:
    """(the cohorts a reservation of ``event`` at ``now`` would read, the calendar's block count),
    from the stored block states (an unopened block: the state it would open with); nothing is
    locked or written, and like :func:`select_cohorts` nothing but the ledger and the calendar is read."""
    acct = account_for(session, dataset.id)
    guarantee = _guarantee(acct, dataset, parameters)
    cal = block_store.calendar(session)
    if cal is None:
        return [], 0
    labels = cohorts_until(cal.start, now or utcnow(), cal.period)
    pb = acct.person_budget
    own, personal = _calendar_blocks(session, acct, labels), _calendar_blocks(session, pb, labels)
    if not read_current:
        own, personal = _closed_only(own), _closed_only(personal)
    try:
        chosen = select_cohorts(acct, pb, own, personal, event, guarantee, dataset=dataset.name)
    except BudgetExceeded:
        chosen = []
    return [label for label, _, _ in chosen], len(labels)


@dataclass(frozen=True)
class BlockRoom:
    """How many more runs of one event a cohort's blocks (data set's and person budget's) can both pay."""

    runs: int
    capped: bool  # the count reached the limit


def block_room(session: Session, dataset: Dataset, event: dp_event.DpEvent, parameters: Mapping[str, Any],
               labels: Sequence[str], *, limit: int) -> tuple[dict[str, BlockRoom], float]:
    """For each cohort of ``labels`` (opened or not: an unopened block counts with the state it would
    open with), the runs of ``event`` its data-set block and its person-budget block can both still
    pay (:func:`app.core.privacy.composition.affordable_runs`, at most ``limit``), and the epsilon of
    one such run alone as charged to the data set. Ledger and calendar facts only; nothing written."""
    acct = account_for(session, dataset.id)
    guarantee = _guarantee(acct, dataset, parameters)
    pb = acct.person_budget
    own, personal = _calendar_blocks(session, acct, labels), _calendar_blocks(session, pb, labels)
    try:
        own_run = charge(ComposedState(), event, guarantee=guarantee, account=account_relation(acct),
                         delta=acct.delta, cap=acct.epsilon_cap)
        person_run = charge(ComposedState(), event, guarantee=guarantee, account=parse_relation(pb.relation),
                            delta=pb.delta, cap=pb.epsilon_cap)
    except ValueError as exc:
        raise RelationRefused(str(exc), dataset=dataset.name, account_relation=acct.relation,
                              event_relation=guarantee.value) from exc
    out = {}
    for label in labels:
        mine = affordable_runs(_block_state(own[label]), own_run.curve, delta=acct.delta, cap=acct.epsilon_cap,
                               limit=limit)
        theirs = affordable_runs(_block_state(personal[label]), person_run.curve, delta=pb.delta, cap=pb.epsilon_cap,
                                 limit=limit)
        runs, capped = min(mine, theirs, key=lambda pair: pair[0])
        out[label] = BlockRoom(runs, capped and mine[1] and theirs[1])
    return out, own_run.epsilon_alone


def cohorts_with_room(session: Session, acct: BudgetAccount, now: datetime | None = None,
                      read_current: bool = True) -> list[str]:
    """The calendar's cohorts whose data-set block and person-budget block are both below their caps:
    every block a run at ``now`` could read, whatever its event (ledger and calendar facts only)."""
    cal = block_store.calendar(session)
    labels = cohorts_until(cal.start, now or utcnow(), cal.period) if cal is not None else [LEGACY]
    if not read_current and labels[-1] != LEGACY:
        labels = labels[:-1]
    pb = acct.person_budget
    own, personal = _calendar_blocks(session, acct, labels), _calendar_blocks(session, pb, labels)
    return [label for label in labels
            if _block_state(own[label]).epsilon_rdp(acct.delta) < acct.epsilon_cap
            and _block_state(personal[label]).epsilon_rdp(pb.delta) < pb.epsilon_cap]


def current_block_spent(session: Session, row: BudgetAccount | PersonBudget, now: datetime | None = None) -> float:
    """The composed epsilon (RDP at its delta) of ``row``'s current block: the cohort users join now."""
    return _current_block_state(session, row, now).epsilon_rdp(row.delta)


def _guarantee(acct: BudgetAccount, dataset: Dataset, parameters: Mapping[str, Any]) -> Relation:
    """The relation ``parameters`` state the guarantee under; ``RelationRefused`` unless it implies
    the account's."""
    guarantee = _parse_or_invalid(parameters.get("neighbouring_relation", NEIGHBOURING_RELATION))
    account = account_relation(acct)
    if not relation_implies(guarantee, account):
        raise RelationRefused(
            f"data set {dataset.name!r} accounts under {account.value}; a guarantee under "
            f"{guarantee.value} does not imply it (declare the weaker relation when creating a data set "
            "for such runs)",
            dataset=dataset.name, account_relation=account.value, event_relation=guarantee.value)
    return guarantee


def record_local_guarantee(
    session: Session,
    *,
    dataset: Dataset,
    event: dp_event.DpEvent,
    parameters: Mapping[str, Any],
    actor: str,
    reason: str | None = None,
    now: datetime | None = None,
) -> LedgerEntry:
    """Record a local guarantee (randomisation at ingestion, e.g. of votes) as a ``local`` entry,
    charged to every block (and to every block opened later: a block opens with them).

    The event (user level: every randomised value one user may ever contribute) is charged once,
    composed with the whole history and checked against the cap under the account lock exactly
    like :func:`reserve`; it is never refunded. Every later training on the randomised values is
    post-processing of it. Does not commit.
    """
    event_json = event_to_json(event)
    acct = lock_account(session, dataset.id)
    return _charge(session, acct, dataset, event, kind="local", actor=actor, event_json=event_json,
                   parameters=parameters, reason=reason, now=now)


def commit(
    session: Session, *, dataset: Dataset, run_id: int, actor: str, parameters: Mapping[str, Any] | None = None
) -> LedgerEntry:
    """Record that run ``run_id``'s reserved release was published (idempotent). Does not commit."""
    acct = lock_account(session, dataset.id)
    existing = _run_entry(session, run_id, "commit")
    if existing is not None:
        return existing
    res = reservation_for(session, run_id)
    if res is None:
        raise NoReservation(f"training run {run_id} has no reservation to commit")
    if _run_entry(session, run_id, "refund") is not None:
        raise RunRefunded(f"training run {run_id} was refunded; its output must not be published")
    last = _last_entry(session, acct.id)
    return _append(
        session,
        acct,
        kind="commit",
        run_id=run_id,
        actor=actor,
        parameters={**base_parameters(acct.relation), **dict(parameters or {})},
        epsilon=res.epsilon,
        spent_rdp=last.spent_rdp if last else 0.0,
        spent_pld=last.spent_pld if last else 0.0,
    )


def refund(session: Session, *, dataset: Dataset, run_id: int, actor: str, reason: str) -> LedgerEntry | None:
    """Release run ``run_id``'s reservation. Only for a failed run with no persisted output:
    the caller guarantees that (``app.services.training``); a committed run is refused.
    Idempotent; returns ``None`` when the run never reserved anything. The run's charge is taken
    out of the account's and the person budget's stored states. Does not commit."""
    acct = lock_account(session, dataset.id)
    existing = _run_entry(session, run_id, "refund")
    if existing is not None:
        return existing
    res = reservation_for(session, run_id)
    if res is None:
        return None
    if _run_entry(session, run_id, "commit") is not None:
        raise RunPublished(f"training run {run_id} was published; its charge cannot be refunded")
    after = account_state(session, acct).remove(charged_event(res, account_relation(acct)), _label(res))
    person = lock_person_budget(session, acct.person_budget_id)
    person_after = person_state(session, person).remove(charged_event(res, parse_relation(person.relation)),
                                                        _label(res))
    total_pld = _store_state(acct, after, acct.delta)
    _store_state(person, person_after, person.delta)
    _refund_blocks(session, res, acct, person)
    return _append(
        session,
        acct,
        kind="refund",
        run_id=run_id,
        actor=actor,
        parameters=base_parameters(acct.relation),
        reason=reason,
        spent_rdp=after.epsilon_rdp(acct.delta),
        spent_pld=total_pld,
    )


def _refund_blocks(session: Session, res: LedgerEntry, acct: BudgetAccount, person: PersonBudget) -> None:
    """Take a refunded reservation out of the blocks it charged (their owners are locked)."""
    cohorts = entry_cohorts(res) or []
    for row, relation in ((acct, account_relation(acct)), (person, parse_relation(person.relation))):
        blocks = block_store.lock_blocks(session, block_owner(row))
        for cohort in cohorts:
            if cohort in blocks:
                state = _block_state(blocks[cohort]).remove(charged_event(res, relation), _label(res))
                _store_block(blocks[cohort], state, row.delta, "refund")
                blocks[cohort].n_runs -= 1


def record_cap_change(
    session: Session, *, dataset: Dataset, new_cap: float, reason: str | None, actor: str
) -> LedgerEntry:
    """Change the cap (audited). Raising needs a reason; lowering below the spend is refused."""
    if not isinstance(new_cap, (int, float)) or not math.isfinite(new_cap) or new_cap <= 0:
        raise InvalidEpsilonCap("the new cap must be a finite number > 0")
    acct = lock_account(session, dataset.id)
    old_cap = acct.epsilon_cap
    current = blocks_spent(session, acct)  # the most spent block: every block has the cap
    if new_cap > old_cap and not (reason and reason.strip()):
        raise ReasonRequired("raising the privacy budget cap requires a reason")
    if new_cap < current:
        raise CapChangeRefused(
            f"cannot lower the cap to {new_cap}: epsilon {round_up(current)} is already spent in a block",
            epsilon_cap=old_cap,
            requested_cap=float(new_cap),
            spent_epsilon=round_up(current),
        )
    acct.epsilon_cap = float(new_cap)
    acct.updated_at = utcnow()
    last = _last_entry(session, acct.id)
    return _append(
        session,
        acct,
        kind="cap_change",
        actor=actor,
        parameters={"old_cap": old_cap, "new_cap": float(new_cap)},
        reason=(reason or "").strip() or None,
        spent_rdp=last.spent_rdp if last else 0.0,
        spent_pld=last.spent_pld if last else 0.0,
    )


# ----------------------------------------------------------------------------- verification
@dataclass(frozen=True)
class ChainCheck:
    """Result of :func:`verify_chain` and :func:`verify_person_budget`."""

    ok: bool
    n_entries: int
    bad_seq: int | None = None
    reason: str | None = None


def verify_chain(session: Session, account_id: int, *, recompute_spend: bool = False) -> ChainCheck:
    """Recompute every hash of the account's chain; with ``recompute_spend`` also every entry's
    stored spend (a replay of the charges as recorded) and the account's stored composed state
    (a replay under its relation), which must equal the replay and lie within the cap."""
    entries = list(session.scalars(select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.seq)))
    prev = GENESIS_HASH
    recorded = ComposedState()
    reserved: dict[int | None, tuple[dp_event.DpEvent, str | None]] = {}
    for expected_seq, entry in enumerate(entries, start=1):
        if entry.seq != expected_seq:
            return ChainCheck(False, len(entries), entry.seq, f"sequence gap: expected {expected_seq}")
        if entry.prev_hash != prev:
            return ChainCheck(False, len(entries), entry.seq, "prev_hash does not match the previous entry")
        if compute_hash(entry_content(entry), prev) != entry.hash:
            return ChainCheck(False, len(entries), entry.seq, "hash does not match the entry's content")
        if recompute_spend and entry.kind in (*CHARGED_KINDS, "refund"):
            if entry.kind in CHARGED_KINDS:
                event, label = recorded_charge(entry), _label(entry)
                if entry.kind == "reservation":
                    reserved[entry.run_id] = (event, label)
                recorded = recorded.add(event, label)
            elif entry.run_id in reserved:
                recorded = recorded.remove(*reserved.pop(entry.run_id))
            if not math.isclose(recorded.epsilon_rdp(entry.delta), entry.spent_rdp, rel_tol=1e-9, abs_tol=1e-12):
                return ChainCheck(False, len(entries), entry.seq, "stored spend differs from the composed events")
        prev = entry.hash
    if recompute_spend:
        acct = session.get(BudgetAccount, account_id)
        if acct is None:
            raise NoBudgetAccount(f"no budget account {account_id}")
        relation = account_relation(acct)
        # under the strongest relation nothing is converted: the charges as recorded are the replay
        replayed = recorded if relation == Relation.ADD_OR_REMOVE_ONE_USER else replay(entries, relation)
        problem = _state_problem(acct, replayed, acct.delta, None)  # the blocks carry the cap
        if problem is not None:
            return ChainCheck(False, len(entries), None, problem)
    return ChainCheck(True, len(entries))


def verify_person_budget(session: Session, person_budget: PersonBudget) -> ChainCheck:
    """Replay every charge of the person budget's data sets and check its stored composed state:
    equal to the replay and within its cap."""
    chain = verify_person_chain(session, person_budget)
    if not chain.ok:
        return chain
    entries = _person_entries(session, person_budget)
    replayed = replay(entries, parse_relation(person_budget.relation))
    problem = _state_problem(person_budget, replayed, person_budget.delta, None)  # the blocks carry the cap
    return ChainCheck(problem is None, len(entries), None, problem)


def _state_problem(row: BudgetAccount | PersonBudget | PrivacyBlock, replayed: ComposedState, delta: float,
                   cap: float | None) -> str | None:
    """Why ``row``'s stored state is wrong (differs from ``replayed``, or is over ``cap``), or None."""
    stored = ComposedState.from_json(row.composed_state)
    if stored is None:
        return "no stored composed state (or one on another RDP order grid)"
    differences = stored.differences(replayed)
    if differences:
        return f"stored composed state differs from the replay: {', '.join(differences)}"
    cached = (row.composed_state or {}).get("epsilon_pld")
    if cached is None or not math.isclose(float(cached), replayed.epsilon_pld(delta), rel_tol=1e-9, abs_tol=1e-12):
        return "stored PLD epsilon differs from the replay"
    if cap is not None and replayed.epsilon_rdp(delta) > cap:
        return "the composed spend is above the cap"
    return None
