"""A per-process cache of external id -> row id for users and items (PostgreSQL rating writes).

A cached id is used only in a transaction that read the same *reference epoch*
(``reference_epoch.n``, :class:`~app.db.models.ReferenceEpoch`) it was cached under: triggers
change the epoch in every transaction that deletes or re-keys users, items or data sets, so the
cached rows exist as long as the epoch a transaction reads is unchanged. Rating writers read it
under the shared references lock (:mod:`app.db.stores.ratings_postgres`), in a statement
after the lock was granted, so a ``delete_user`` that committed meanwhile is seen; a delete that
comes later waits for the writer's commit. Ids read or created in a transaction join the cache
only when the session commits (a user created by a transaction rolled back does not exist): on
SQLAlchemy's own commit event, so whoever commits (a route's unit of work, a CLI, a test) fills it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from app.db.dialect import driver_connection

__all__ = ["ReferenceIds", "reference_ids", "reference_ids_at", "READ_EPOCH", "remember_on_commit", "MAX_CACHED_IDS"]

MAX_CACHED_IDS = 250_000  # users and items together, per database; the cache is emptied when full
_lock = threading.Lock()  # guards _by_database
_add_lock = threading.Lock()  # serialises ReferenceIds.add
_PENDING = "privrec.reference_ids.pending"  # Session.info key: what joins the cache at commit
# the epoch, and what tells this database apart from one created again under the same URL (its
# oid; the table's, should it be dropped and restored) or restored to an earlier state (a server
# started anew): cached ids are valid only while all four are unchanged
READ_EPOCH = ("SELECT n, (SELECT oid FROM pg_database WHERE datname = current_database()), "
               "'reference_epoch'::regclass::oid, pg_postmaster_start_time() FROM reference_epoch")


@dataclass
class ReferenceIds:
    """The ids cached for one database and epoch: users by external id, items by data set row id
    and external id. Read them through :meth:`items_of` and the ``users`` map; add through
    :func:`remember_on_commit`."""

    epoch: tuple[Any, ...]
    users: dict[str, int] = field(default_factory=dict)
    items: dict[int, dict[str, int]] = field(default_factory=dict)

    def items_of(self, dataset_id: int) -> dict[str, int]:
        return self.items.get(dataset_id, {})

    def add(self, users: dict[str, int], dataset_id: int | None, items: dict[str, int]) -> None:
        """Called at commit (any thread); readers only look ids up, so one lock serialises adds."""
        with _add_lock:
            size = len(self.users) + sum(map(len, self.items.values()))
            if size + len(users) + len(items) > MAX_CACHED_IDS:
                self.users.clear()
                self.items.clear()
            self.users.update(users)
            if dataset_id is not None and items:
                self.items.setdefault(dataset_id, {}).update(items)


_by_database: dict[str, ReferenceIds] = {}


def reference_ids(session: Session) -> ReferenceIds:
    """The cached ids valid in ``session``'s transaction (PostgreSQL; call under the references
    lock, which makes the epoch read here hold until commit)."""
    with driver_connection(session).cursor() as cursor:
        row = cursor.execute(READ_EPOCH).fetchone()
    return reference_ids_at(session, row)


def reference_ids_at(session: Session, row: tuple[Any, ...] | None) -> ReferenceIds:
    """The cached ids for the epoch ``row`` that :data:`READ_EPOCH` returned in ``session``'s
    transaction (read by the caller, e.g. pipelined with the references lock)."""
    if row is None:
        raise RuntimeError("reference_epoch has no row; run the migrations")
    key = session.connection().engine.url.render_as_string(hide_password=True)
    with _lock:
        ids = _by_database.get(key)
        if ids is None or ids.epoch != tuple(row):
            ids = _by_database[key] = ReferenceIds(epoch=tuple(row))
        return ids


def remember_on_commit(session: Session, ids: ReferenceIds, *, users: dict[str, int] | None = None,
                       dataset_id: int | None = None, items: dict[str, int] | None = None) -> None:
    """Add ``users`` and the data set's ``items`` (read or written in ``session``'s transaction)
    to ``ids`` when, and only if, the transaction commits. Inside a savepoint (``begin_nested``),
    which can be rolled back alone, nothing is remembered."""
    if not session.in_nested_transaction():
        session.info.setdefault(_PENDING, []).append((ids, users or {}, dataset_id, items or {}))


@event.listens_for(Session, "after_commit")
def _publish(session: Session) -> None:
    if session.in_nested_transaction():  # a savepoint released: the transaction goes on
        return
    for ids, users, dataset_id, items in session.info.pop(_PENDING, ()):
        ids.add(users, dataset_id, items)


@event.listens_for(Session, "after_transaction_end")
def _discard(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost transaction ended without a commit (or after one)
        session.info.pop(_PENDING, None)
