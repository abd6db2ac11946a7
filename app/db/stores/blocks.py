"""The privacy-block store: the block calendar, users' cohorts and the block accounts' rows.

A user's cohort is settled lazily and deterministically: the cohort recorded for her hashed
external id when one exists (she was deleted and came back), else the period of her row's
``created_at`` (which never changes). Settling writes the row's ``cohort`` and the record, so a
later deletion keeps it. Nothing here decides which blocks a run reads (:mod:`app.ledger` does,
from the ledger and the calendar).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.core.privacy.blocks import check_period, cohort_of
from app.db.dialect import CHUNK, chunks, insert_for
from app.db.models import BlockCalendar, PrivacyBlock, User, UserCohort
from app.db.session import is_postgres

__all__ = ["user_key", "calendar", "ensure_calendar", "settle_cohorts", "cohort_of_user", "blocks_of",
           "lock_blocks", "add_block", "all_blocks"]

CALENDAR_ID = 1


def user_key(external_id: str) -> str:
    """sha256 of the external user id: the key her cohort outlives her row under."""
    return hashlib.sha256(f"cohort\x00{external_id}".encode()).hexdigest()


def calendar(session: Session) -> BlockCalendar | None:
    """The deployment's block calendar, if written."""
    return session.get(BlockCalendar, CALENDAR_ID)


def ensure_calendar(session: Session, period: str, now: datetime) -> BlockCalendar:
    """The calendar; written with ``period`` starting at ``now``'s period when missing (a concurrent
    writer's row wins: the calendar is written once and never changed)."""
    found = calendar(session)
    if found is not None:
        return found
    session.execute(insert_for(session, BlockCalendar.__table__).values(
        id=CALENDAR_ID, period=check_period(period), start=cohort_of(now, period)).on_conflict_do_nothing())
    row = session.get(BlockCalendar, CALENDAR_ID, populate_existing=True)
    if row is None:  # pragma: no cover - just written
        raise RuntimeError("the block calendar could not be written")
    return row


def settle_cohorts(session: Session, cal: BlockCalendar, user_ids: Sequence[int] | None = None) -> int:
    """Write the cohort of every user whose row has none (or of ``user_ids`` only); the number set.
    A user created before the calendar's first period joins that first period."""
    def first_cohort(created: datetime) -> str:
        return max(cohort_of(created, cal.period), cal.start)

    stmt = select(User.id, User.external_id, User.created_at).where(User.cohort.is_(None))
    if user_ids is not None:
        stmt = stmt.where(User.id.in_(list(user_ids)))
    rows = session.execute(stmt.order_by(User.id)).all()
    for part in chunks(rows, CHUNK):
        keys = {ext: user_key(ext) for _, ext, _ in part}
        kept = dict(session.execute(select(UserCohort.user_key, UserCohort.cohort)
                                    .where(UserCohort.user_key.in_(list(keys.values())))).all())
        by_cohort: dict[str, list[int]] = {}
        for uid, ext, created in part:
            by_cohort.setdefault(kept.get(keys[ext]) or first_cohort(created), []).append(uid)
        for cohort, ids in sorted(by_cohort.items()):
            session.execute(update(User).where(User.id.in_(ids), User.cohort.is_(None)).values(cohort=cohort)
                            .execution_options(synchronize_session=False))
        new = [{"user_key": keys[ext], "cohort": kept.get(keys[ext]) or first_cohort(created)}
               for _, ext, created in part if keys[ext] not in kept]
        if new:
            session.execute(insert_for(session, UserCohort.__table__).values(new).on_conflict_do_nothing())
    return len(rows)


def cohort_of_user(session: Session, external_id: str) -> str | None:
    """The cohort of the user ``external_id`` (her row's, else her kept record), or None."""
    own = session.scalar(select(User.cohort).where(User.external_id == external_id))
    if own is not None:
        return own
    return session.scalar(select(UserCohort.cohort).where(UserCohort.user_key == user_key(external_id)))


def blocks_of(session: Session, owner: str) -> dict[str, PrivacyBlock]:
    """The opened blocks of ``owner`` (``account:<id>`` or ``person_budget:<id>``) by cohort (no lock;
    the ledger writes them only under their owner's row lock)."""
    rows = session.scalars(select(PrivacyBlock).where(PrivacyBlock.owner == owner)
                           .execution_options(populate_existing=True))
    return {b.cohort: b for b in rows}


def lock_blocks(session: Session, owner: str) -> dict[str, PrivacyBlock]:
    """:func:`blocks_of`, each row locked (PostgreSQL ``FOR UPDATE``, in cohort order)."""
    stmt = select(PrivacyBlock).where(PrivacyBlock.owner == owner).order_by(PrivacyBlock.cohort)
    if is_postgres(session):
        stmt = stmt.with_for_update()
    return {b.cohort: b for b in session.scalars(stmt.execution_options(populate_existing=True))}


def add_block(session: Session, *, owner: str, account_id: int | None, person_budget_id: int | None, cohort: str,
              composed_state: dict[str, object]) -> PrivacyBlock:
    """Open one block (its owner's row is locked by the caller)."""
    block = PrivacyBlock(owner=owner, account_id=account_id, person_budget_id=person_budget_id, cohort=cohort,
                         composed_state=composed_state, n_runs=0)
    session.add(block)
    session.flush()
    return block


def all_blocks(session: Session) -> list[PrivacyBlock]:
    """Every opened block (for ``ledger verify``)."""
    return list(session.scalars(select(PrivacyBlock).order_by(PrivacyBlock.owner, PrivacyBlock.cohort)))
