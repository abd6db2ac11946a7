"""Votes (thumbs up/down) as stored: the bits, the per-user allowance of randomised bits and the
local ledger entry of their settings (PostgreSQL and SQLite).

:func:`votes_store` picks the implementation from the session's dialect once: PostgreSQL takes
the row locks that serialise each user's writers; SQLite serialises writers and takes none.
Nothing here commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.dialect import insert_for
from app.db.models import Item, LedgerEntry, User, Vote, VoteAllowance, table_of
from app.db.session import store_for

__all__ = ["PostgresVotesStore", "SqliteVotesStore", "VotesStore", "votes_store"]

UPSERT_CHUNK = 1000


class VotesStore:
    """The votes of one session (the interface; :func:`votes_store` gives the dialect's
    implementation)."""

    row_locks: ClassVar[bool] = False

    def __init__(self, session: Session) -> None:
        self.session = session

    def latest_local_entry(self, account_id: int) -> LedgerEntry | None:
        """The account's latest local (randomised-response) ledger entry."""
        return self.session.scalar(select(LedgerEntry)
                                   .where(LedgerEntry.account_id == account_id, LedgerEntry.kind == "local")
                                   .order_by(LedgerEntry.seq.desc()).limit(1))

    def count_votes(self, dataset_id: int) -> int:
        """How many votes the data set stores."""
        return int(self.session.scalar(select(func.count()).select_from(Vote)
                                       .where(Vote.dataset_id == dataset_id)) or 0)

    def votes_ever_given(self, dataset_id: int) -> bool:
        """Whether the data set holds a vote or ever gave out a randomised bit."""
        vote = self.session.scalar(select(Vote.id).where(Vote.dataset_id == dataset_id).limit(1))
        given = self.session.scalar(select(VoteAllowance.user_key).where(
            VoteAllowance.dataset_id == dataset_id, VoteAllowance.randomised_votes > 0).limit(1))
        return vote is not None or given is not None

    def lock_users(self, uids: Sequence[int]) -> None:
        """Serialise writers per user: row locks in id order (no deadlocks); PostgreSQL only."""
        if self.row_locks and uids:
            self.session.execute(select(User.id).where(User.id.in_(sorted(set(uids)))).order_by(User.id)
                                 .with_for_update(key_share=True))

    def existing_votes(self, dataset_id: int, uids: Sequence[int]) -> dict[tuple[int, int], Vote]:
        """The data set's stored votes of these users, keyed by (user, item) row ids."""
        rows = self.session.scalars(select(Vote).where(Vote.dataset_id == dataset_id,
                                                       Vote.user_id.in_(sorted(set(uids)))))
        return {(v.user_id, v.item_id): v for v in rows}

    def upsert_raw_votes(self, values: Sequence[dict[str, Any]]) -> None:
        """Insert raw votes, a stored (data set, user, item) getting the new value."""
        for start in range(0, len(values), UPSERT_CHUNK):
            stmt = insert_for(self.session, Vote.__table__).values(list(values[start:start + UPSERT_CHUNK]))
            self.session.execute(stmt.on_conflict_do_update(
                index_elements=["dataset_id", "user_id", "item_id"],
                set_={"value": stmt.excluded.value, "updated_at": stmt.excluded.updated_at}))

    def insert_votes(self, values: Sequence[dict[str, Any]]) -> None:
        """Insert new votes (randomised bits: never replaced)."""
        self.session.execute(table_of(Vote).insert(), list(values))

    def allowances(self, dataset_id: int, keys: Sequence[str]) -> dict[str, VoteAllowance]:
        """The allowance rows of these user keys, by key."""
        rows = self.session.scalars(select(VoteAllowance).where(VoteAllowance.dataset_id == dataset_id,
                                                                VoteAllowance.user_key.in_(sorted(set(keys)))))
        return {a.user_key: a for a in rows}

    def stored_vote(self, dataset_id: int, user_id: str, item_id: str) -> Vote | None:
        """The stored vote of external user ``user_id`` for external item ``item_id``, read afresh."""
        return self.session.scalar(select(Vote).join(User, User.id == Vote.user_id).join(Item, Item.id == Vote.item_id)
                                   .where(Vote.dataset_id == dataset_id, User.external_id == user_id,
                                          Item.external_id == item_id)
                                   .execution_options(populate_existing=True))

    def delete_vote(self, vote_id: int) -> None:
        """Delete one vote row."""
        self.session.execute(delete(Vote).where(Vote.id == vote_id))

    def user_votes(self, dataset_id: int, user_id: str) -> list[tuple[str, int]]:
        """(external item id, ±1) of every stored bit of one user in a data set."""
        rows = self.session.execute(
            select(Item.external_id, Vote.value).join(Item, Item.id == Vote.item_id).join(User, User.id == Vote.user_id)
            .where(Vote.dataset_id == dataset_id, User.external_id == user_id))
        return [(str(e), int(v)) for e, v in rows]

    def user_votes_page(self, dataset_id: int, user_id: str, offset: int,
                        limit: int) -> tuple[list[tuple[str, int, bool, str | None, float | None, datetime]], int]:
        """One page of a user's stored bits by item id: (item, value, randomised, by, ε0, updated at),
        and their total count."""
        base = (select(Item.external_id, Vote.value, Vote.randomised, Vote.randomised_by, Vote.local_epsilon,
                       Vote.updated_at)
                .join(Item, Item.id == Vote.item_id).join(User, User.id == Vote.user_id)
                .where(Vote.dataset_id == dataset_id, User.external_id == user_id))
        total = self.session.scalar(select(func.count()).select_from(base.subquery())) or 0
        rows = self.session.execute(base.order_by(Item.external_id).offset(offset).limit(limit)).all()
        return [(e, int(v), bool(r), by, eps, t) for e, v, r, by, eps, t in rows], int(total)


class PostgresVotesStore(VotesStore):
    """Votes on PostgreSQL: user rows are locked in id order."""

    row_locks = True


class SqliteVotesStore(VotesStore):
    """Votes on SQLite: one writer at a time, so no row lock."""


_STORES: dict[str, type[VotesStore]] = {"postgresql": PostgresVotesStore, "sqlite": SqliteVotesStore}


def votes_store(session: Session) -> VotesStore:
    """The votes store of ``session``'s database (chosen by its dialect)."""
    return store_for(session, _STORES)
