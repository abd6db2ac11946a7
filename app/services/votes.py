"""Votes (thumbs up/down): settings, ingestion with randomised response, listing.

A data set either stores **raw** votes (``vote_local_epsilon`` NULL: idempotent upserts, like
ratings) or **randomises at ingestion** (local DP, docs/algorithms.md §4, InP):

* each vote is randomised exactly once on arrival, flipped with p = 1/(1+e^ε0) by
  ``app.core.onebit.randomize_votes`` from a generator seeded per request with 128 bits from the
  OS CSPRNG (``secrets``), or by the client, which then declares ε0 (it must equal the data set's);
* only the bit, ε0 and who randomised are stored, never the raw vote; the raw values live in
  this request's memory only and are never logged or returned;
* a (user, item) that already holds a bit is neither re-randomised nor replaced ("unchanged"):
  re-randomising the same vote would let repeated submissions average the noise away;
* each user may be given at most ``votes_per_user_cap`` = k bits, ever (``VoteAllowance``; a
  delete gives nothing back, since a later vote is a fresh randomisation), so the local guarantee
  is k·ε0 per user; it is recorded in the ledger once, when the settings are made
  (``set_vote_settings``), and every training on the bits is post-processing of it.

Randomised response hides vote *values* only: which items a user voted on is not hidden (the
neighbouring relation of the local entry says so). Functions never commit; the caller does.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from sqlalchemy.orm import Session

from app import ledger
from app.core.onebit import flip_probability, local_randomisation_event, randomize_votes
from app.core.privacy.accounting import Relation
from app.db.models import Dataset, LedgerEntry, Vote, VoteAllowance, bump_ratings_version, utcnow
from app.db.stores import catalogue_store
from app.db.stores.catalogue import DatasetLock
from app.db.stores.votes import votes_store
from app.errors import (
    CapRequired,
    InvalidRows,
    LocalEpsilonMismatch,
    PrivrecError,
    RandomisedNotAccepted,
    UnknownItem,
    UnknownVote,
    VoteCapExceeded,
    VoteSettingsChanged,
    VotesExist,
)
from app.schemas.common import Page
from app.schemas.votes import Status, VoteBatchOut, VoteIn, VoteOut, VoteRow, VoteRowResult, VoteSettingsOut, VoteWriteOut
from app.services.catalog import item_row_ids, refuse_votes_per_period
from app.services.ingest import ensure_user_rows

__all__ = [
    "LOCAL_RELATION",
    "get_vote_settings",
    "set_vote_settings",
    "upsert_vote",
    "upsert_votes_batch",
    "import_votes",
    "delete_vote",
    "list_user_votes",
    "user_votes_arrays",
]

Randomiser = Literal["server", "client"]  # who applied randomised response to a stored vote

LOCAL_RELATION = (
    "replace the values of one user's votes (at most votes_per_user_cap of them): which items a "
    "user voted on is NOT hidden by randomised response"
)
DELETE_NOTE = (
    "The vote is gone. On a data set that randomises at ingestion the user's allowance of "
    "randomised votes is not given back: a new vote for this item is a fresh randomisation."
)


# ----------------------------------------------------------------------------- data set access
def _dataset(session: Session, name: str, *, lock: DatasetLock | None = None) -> Dataset:
    """The data set ``name`` (404), optionally row-locked on PostgreSQL.

    ``lock="share"`` (ingestion): FOR KEY SHARE, compatible with other ingests (and with their
    ``ratings_version`` bump) but not with ``lock="update"`` (settings changes): a vote is never
    written under settings that are being changed. SQLite serialises writers anyway.
    """
    return catalogue_store(session).get_dataset(name, lock=lock)


def _randomising(ds: Dataset) -> bool:
    return ds.vote_local_epsilon is not None


def _epsilon0(ds: Dataset) -> float:
    """The local epsilon of a data set that randomises its votes."""
    if ds.vote_local_epsilon is None:
        raise RuntimeError(f"data set {ds.name!r} stores raw votes: it has no local epsilon")
    return float(ds.vote_local_epsilon)


def _randomiser(stored: str | None) -> Randomiser | None:
    """A stored vote's ``randomised_by`` (the table's check constraint admits only these values)."""
    return cast("Randomiser | None", stored)  # ck_votes_randomisation_recorded: 'server', 'client' or NULL


# ----------------------------------------------------------------------------- settings
def _local_entry(session: Session, ds: Dataset) -> LedgerEntry | None:
    acct = ledger.account_for(session, ds.id)
    return votes_store(session).latest_local_entry(acct.id)


def _settings_out(session: Session, ds: Dataset) -> VoteSettingsOut:
    eps0, cap = ds.vote_local_epsilon, ds.votes_per_user_cap
    n_votes = votes_store(session).count_votes(ds.id)
    entry = _local_entry(session, ds) if eps0 is not None else None
    return VoteSettingsOut(
        dataset=ds.name, local_epsilon=eps0, votes_per_user_cap=cap, randomised_at_ingestion=eps0 is not None,
        flip_probability=None if eps0 is None else flip_probability(eps0),
        user_level_epsilon=None if eps0 is None or cap is None else cap * eps0,
        n_votes=int(n_votes), local_ledger_seq=None if entry is None else entry.seq,
    )


def get_vote_settings(session: Session, *, dataset: str) -> VoteSettingsOut:
    """The data set's vote settings and vote count."""
    return _settings_out(session, _dataset(session, dataset))


def local_parameters(epsilon0: float, cap: int) -> dict[str, Any]:
    """Parameters that give the local entry's event its meaning."""
    return {
        "mechanism": "randomised_response",
        "applied": "once per vote at ingestion (server, CSPRNG) or by the client, never repeated",
        "level": "user",
        "local_epsilon": float(epsilon0),
        "votes_per_user_cap": int(cap),
        "flip_probability": flip_probability(epsilon0),
        "user_level_epsilon": int(cap) * float(epsilon0),
        "neighbouring_relation": Relation.REPLACE_VOTE_VALUES.value,
        "relation": LOCAL_RELATION,
        "post_processing": "every training on the stored bits (charged 0)",
    }


def _votes_ever_given(session: Session, ds: Dataset) -> bool:
    """Whether the data set holds a vote or ever gave out a randomised bit."""
    return votes_store(session).votes_ever_given(ds.id)


def set_vote_settings(session: Session, *, dataset: str, local_epsilon: float | None,
                      votes_per_user_cap: int | None, actor: str) -> VoteSettingsOut:
    """Set ε0 (None: raw votes) and the per-user cap. Does not commit.

    Refused with 409 once the data set holds a vote or ever randomised one (a stored bit is never
    re-randomised, and raw and randomised bits must not mix). Turning randomisation on records
    the local guarantee (k-fold randomised response, user level k·ε0) in the ledger, cap-checked
    like a training (409 ``budget_exceeded``). Setting the current values again changes nothing.
    The ledger is append-only: a guarantee recorded by an earlier setting stays charged.
    """
    if local_epsilon is not None and votes_per_user_cap is None:
        raise CapRequired("randomisation at ingestion needs votes_per_user_cap")
    ds = _dataset(session, dataset, lock="update")
    refuse_votes_per_period(ds.name, ds.privacy_unit)
    ledger.lock_account(session, ds.id)  # settings and budget changes serialise
    if (ds.vote_local_epsilon, ds.votes_per_user_cap) == (local_epsilon, votes_per_user_cap):
        return _settings_out(session, ds)
    if _votes_ever_given(session, ds):
        raise VotesExist(
            f"data set {ds.name!r} already holds votes: its vote settings can no longer change "
            "(stored bits are never re-randomised, and raw and randomised votes must not mix)",
            details={"dataset": ds.name, "local_epsilon": ds.vote_local_epsilon,
                     "votes_per_user_cap": ds.votes_per_user_cap})
    if local_epsilon is not None:
        assert votes_per_user_cap is not None
        event = local_randomisation_event(float(local_epsilon), int(votes_per_user_cap))
        ledger.record_local_guarantee(session, dataset=ds, event=event, actor=actor,
                                      parameters=local_parameters(local_epsilon, votes_per_user_cap),
                                      reason="votes randomised at ingestion")
    ds.vote_local_epsilon = None if local_epsilon is None else float(local_epsilon)
    ds.votes_per_user_cap = votes_per_user_cap
    session.flush()
    return _settings_out(session, ds)


# ----------------------------------------------------------------------------- ingestion
@dataclass
class _Batch:
    """Validated rows resolved to database ids."""

    users: list[str]
    items: list[str]
    uids: list[int]
    iids: list[int]
    rows: Sequence[VoteIn]


def _row_error(ds: Dataset, row: VoteIn, item: str, known: bool) -> PrivrecError | None:
    """The error of an invalid row (its condition and message), or None."""
    if not known:
        return UnknownItem(f"unknown item {item!r} in data set {ds.name!r}", details={"item_id": item})
    if row.randomised and not _randomising(ds):
        return RandomisedNotAccepted(
            f"data set {ds.name!r} stores raw votes; a client-randomised vote is not accepted", details={"item_id": item})
    if row.randomised and row.local_epsilon != ds.vote_local_epsilon:
        return LocalEpsilonMismatch(
            f"the vote was randomised with epsilon0 {row.local_epsilon!r}; data set {ds.name!r} "
            f"requires exactly {ds.vote_local_epsilon!r}", details={"item_id": item})
    return None


def _validate(session: Session, ds: Dataset, users: Sequence[str], items: Sequence[str],
              rows: Sequence[VoteIn]) -> dict[str, int]:
    """Item ids of the rows; 422 ``invalid_rows`` with per-row errors (nothing written) otherwise."""
    item_map = item_row_ids(session, ds, list(items))
    errors: list[VoteRowResult] = []
    seen: dict[tuple[str, str], int] = {}
    for k, (u, i, row) in enumerate(zip(users, items, rows, strict=True)):
        first = seen.setdefault((u, i), k)
        problem = _row_error(ds, row, i, i in item_map)
        message = problem.message if problem is not None else None
        if message is None and first != k:
            message = f"duplicate (user, item) pair; first at row {first}"
        if message is not None:
            errors.append(VoteRowResult(index=k, user_id=u, item_id=i, status="error", error=message))
    if errors:
        raise InvalidRows(f"{len(errors)} of {len(rows)} rows are invalid; nothing was written",
                          details={"rows": [e.model_dump() for e in errors[:1000]], "n_invalid": len(errors)})
    return item_map


def _lock_users(session: Session, uids: Sequence[int]) -> None:
    """Serialise writers per user (cap checks): row locks in id order (no deadlocks)."""
    votes_store(session).lock_users(uids)


def _existing(session: Session, ds: Dataset, uids: Sequence[int]) -> dict[tuple[int, int], Vote]:
    """The data set's stored votes of these users, keyed by (user, item) row ids."""
    return votes_store(session).existing_votes(ds.id, uids)


def _cap_refusal(ds: Dataset, over: dict[str, tuple[int, int]], randomised: bool) -> VoteCapExceeded:
    what = "randomised votes ever given (deletes give none back)" if randomised else "stored votes"
    return VoteCapExceeded(
        f"{len(over)} user(s) would exceed the cap of {ds.votes_per_user_cap} {what} in data set "
        f"{ds.name!r}; nothing was written",
        details={"votes_per_user_cap": ds.votes_per_user_cap, "counted": what,
                 "users": [{"user_id": u, "current": c, "new": n} for u, (c, n) in sorted(over.items())[:1000]]})


def _check_cap(ds: Dataset, current: dict[int, int], new: dict[int, int], names: dict[int, str],
               randomised: bool) -> None:
    cap = ds.votes_per_user_cap
    if cap is None:
        return
    over = {names[u]: (current.get(u, 0), n) for u, n in new.items() if current.get(u, 0) + n > cap}
    if over:
        raise _cap_refusal(ds, over, randomised)


def _count_new(pairs: Sequence[tuple[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for u, _ in pairs:
        out[u] = out.get(u, 0) + 1
    return out


def _write_raw(session: Session, ds: Dataset, b: _Batch) -> list[Status]:
    """Upsert raw votes; statuses created/updated."""
    existing = _existing(session, ds, b.uids)
    pairs = list(zip(b.uids, b.iids, strict=True))
    fresh = [p for p in pairs if p not in existing]
    current = _count_new(list(existing))
    _check_cap(ds, current, _count_new(fresh), dict(zip(b.uids, b.users, strict=True)), randomised=False)
    now = utcnow()
    values = [{"dataset_id": ds.id, "user_id": u, "item_id": i, "value": int(r.vote), "randomised": False,
               "local_epsilon": None, "randomised_by": None, "created_at": now, "updated_at": now}
              for (u, i), r in zip(pairs, b.rows, strict=True)]
    votes_store(session).upsert_raw_votes(values)
    return ["updated" if p in existing else "created" for p in pairs]


def _randomised_bits(ds: Dataset, rows: Sequence[VoteIn]) -> tuple[np.ndarray, list[Randomiser]]:
    """The bits to store for ``rows`` and who randomised each: the server randomises the raw
    votes once, here, with a fresh CSPRNG-seeded generator; client bits are kept as sent."""
    raw = np.fromiter((r.vote for r in rows), dtype=np.int8, count=len(rows))
    by_client = np.fromiter((r.randomised for r in rows), dtype=bool, count=len(rows))
    bits = raw.copy()
    server = ~by_client
    if server.any():
        rng = np.random.default_rng(secrets.randbits(128))
        bits[server] = randomize_votes(raw[server], _epsilon0(ds), rng)
    return bits, ["client" if c else "server" for c in by_client]


def _write_randomised(session: Session, ds: Dataset, b: _Batch) -> list[Status]:
    """Store a randomised bit for each new (user, item); existing bits stay ("unchanged")."""
    existing = _existing(session, ds, b.uids)
    pairs = list(zip(b.uids, b.iids, strict=True))
    new_k = [k for k, p in enumerate(pairs) if p not in existing]
    keys = {uid: allowance_key(ds.id, user) for uid, user in zip(b.uids, b.users, strict=True)}
    by_key = votes_store(session).allowances(ds.id, list(keys.values()))
    allowances = {uid: by_key[key] for uid, key in keys.items() if key in by_key}
    new_per_user = _count_new([pairs[k] for k in new_k])
    current = {u: a.randomised_votes for u, a in allowances.items()}
    _check_cap(ds, current, new_per_user, dict(zip(b.uids, b.users, strict=True)), randomised=True)
    if new_k:
        bits, by = _randomised_bits(ds, [b.rows[k] for k in new_k])
        now = utcnow()
        votes_store(session).insert_votes([
            {"dataset_id": ds.id, "user_id": pairs[k][0], "item_id": pairs[k][1], "value": int(bit),
             "randomised": True, "local_epsilon": _epsilon0(ds), "randomised_by": who,
             "created_at": now, "updated_at": now}
            for k, bit, who in zip(new_k, bits.tolist(), by, strict=True)])
        _give_allowance(session, ds, allowances, new_per_user, keys)
    fresh = set(new_k)
    return ["created" if k in fresh else "unchanged" for k in range(len(pairs))]


def allowance_key(dataset_id: int, external_user_id: str) -> str:
    """The allowance row's key: sha256 of (data set id, external user id), so that it outlives the
    users row (a deleted and re-created user keeps their count) without storing the id itself."""
    return hashlib.sha256(f"{int(dataset_id)}\x00{external_user_id}".encode()).hexdigest()


def _give_allowance(session: Session, ds: Dataset, allowances: dict[int, VoteAllowance],
                    new_per_user: dict[int, int], keys: dict[int, str]) -> None:
    for uid, n in new_per_user.items():
        row = allowances.get(uid)
        if row is None:
            session.add(VoteAllowance(dataset_id=ds.id, user_key=keys[uid], randomised_votes=n))
        else:
            row.randomised_votes += n
    session.flush()


def _write(session: Session, ds: Dataset, users: Sequence[str], items: Sequence[str],
           rows: Sequence[VoteIn]) -> list[Status]:
    """Validate then write; status per row. All or nothing (the caller rolls back on error)."""
    item_map = _validate(session, ds, users, items, rows)
    user_map = ensure_user_rows(session, list(users), utcnow())
    uids = [user_map[u] for u in users]
    _lock_users(session, uids)
    batch = _Batch(users=list(users), items=list(items), uids=uids, iids=[item_map[i] for i in items], rows=rows)
    status = (_write_randomised if _randomising(ds) else _write_raw)(session, ds, batch)
    changed = sum(s != "unchanged" for s in status)
    if changed:
        bump_ratings_version(session, ds.id, n=changed)
    return status


def _stored(session: Session, ds: Dataset, user_id: str, item_id: str) -> Vote:
    vote = votes_store(session).stored_vote(ds.id, user_id, item_id)
    if vote is None:
        raise UnknownVote("no such vote", details={"user_id": user_id, "item_id": item_id})
    return vote


def upsert_vote(session: Session, *, dataset: str, user_id: str, item_id: str, body: VoteIn) -> VoteWriteOut:
    """Store one vote (see the module docstring); 404 unknown item, 422 bad declaration, 409 cap."""
    ds = _dataset(session, dataset, lock="share")
    if not item_row_ids(session, ds, [item_id]):
        raise UnknownItem(f"unknown item {item_id!r} in data set {dataset!r}",
                          details={"item_id": item_id})
    problem = _row_error(ds, body, item_id, True)
    if problem is not None:
        raise problem
    status = _write(session, ds, [user_id], [item_id], [body])[0]
    vote = _stored(session, ds, user_id, item_id)
    return VoteWriteOut(user_id=user_id, item_id=item_id, status=status, stored_vote=vote.value,
                        randomised=vote.randomised, randomised_by=_randomiser(vote.randomised_by),
                        local_epsilon=vote.local_epsilon)


def upsert_votes_batch(session: Session, *, dataset: str, rows: Sequence[VoteRow]) -> VoteBatchOut:
    """Store a batch all or nothing, with a status per row."""
    ds = _dataset(session, dataset, lock="share")
    users = [r.user_id for r in rows]
    items = [r.item_id for r in rows]
    status = _write(session, ds, users, items, rows)
    results = [VoteRowResult(index=k, user_id=u, item_id=i, status=s)
               for k, (u, i, s) in enumerate(zip(users, items, status, strict=True))]
    return VoteBatchOut(created=status.count("created"), updated=status.count("updated"),
                        unchanged=status.count("unchanged"), results=results)


def import_votes(session: Session, *, dataset: str, rows: Sequence[tuple[str, str, int]]) -> dict[str, int]:
    """Bulk import (CLI) of raw ``(user, item, ±1)`` votes through the same path as the API
    (randomised on arrival on a randomising data set). A repeated pair in ``rows`` is refused."""
    votes = [VoteRow(user_id=str(u), item_id=str(i), vote=int(v)) for u, i, v in rows]
    out = upsert_votes_batch(session, dataset=dataset, rows=votes)
    return {"created": out.created, "updated": out.updated, "unchanged": out.unchanged}


def delete_vote(session: Session, *, dataset: str, user_id: str, item_id: str) -> int:
    """Delete one vote (404 when absent). The randomised-vote allowance is not given back."""
    ds = _dataset(session, dataset, lock="share")
    vote = _stored(session, ds, user_id, item_id)
    votes_store(session).delete_vote(vote.id)
    bump_ratings_version(session, ds.id, n=1)
    return 1


# ----------------------------------------------------------------------------- reading
def user_votes_arrays(session: Session, *, dataset_id: int, user_id: str) -> tuple[list[str], list[float]]:
    """The one user's own stored bits in a data set: (external item ids, ±1). Privileged."""
    rows = votes_store(session).user_votes(dataset_id, user_id)
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def list_user_votes(session: Session, *, dataset: str, user_id: str, offset: int, limit: int) -> Page[VoteOut]:
    """One page of the user's own stored bits, ordered by item id."""
    ds = _dataset(session, dataset)
    rows, total = votes_store(session).user_votes_page(ds.id, user_id, offset, limit)
    items = [VoteOut(item_id=e, vote=v, randomised=r, randomised_by=_randomiser(by), local_epsilon=eps, updated_at=t)
             for e, v, r, by, eps, t in rows]
    return Page[VoteOut].build(items, total=total, offset=offset, limit=limit)


# ----------------------------------------------------------------------------- training
def check_pre_randomised_settings(ds: Dataset, local_epsilon: float | None) -> None:
    """Refuse a free, pre-randomised run unless the data set still randomises votes with exactly
    ``local_epsilon``: a public fact (its vote settings), checked before any vote is read."""
    if local_epsilon is None or ds.vote_local_epsilon != float(local_epsilon):
        raise VoteSettingsChanged(f"data set {ds.name!r} no longer randomises votes with epsilon0 {local_epsilon}: "
                             "a pre-randomised (free) run cannot train on its votes")


def lock_pre_randomised(session: Session, ds: Dataset, local_epsilon: float) -> Dataset:
    """Lock the data set's vote settings (FOR KEY SHARE on PostgreSQL, as ingestion does) until
    the training data is read in this transaction, and re-check them (public). The read itself
    (:func:`app.db.loaders.load_votes` with ``local_epsilon``) takes only bits randomised with ε0, so a stored
    bit that was not (impossible through this module) is never read and decides nothing."""
    locked = _dataset(session, ds.name, lock="share")
    check_pre_randomised_settings(locked, local_epsilon)
    return locked
