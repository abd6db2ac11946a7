"""Actions held on a session until its unit of work commits (SQLAlchemy's session events): the
storage half of :mod:`app.services.unit_of_work`."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

__all__ = ["hold", "take"]

_AFTER_COMMIT = "privrec.after_commit"


def hold(session: Session, action: Callable[[], object]) -> None:
    """Keep ``action`` on the session until :func:`take` (dropped if the unit of work rolls back)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(action)


def take(session: Session) -> list[Callable[[], object]]:
    """The actions held on the session, in registration order, no longer held."""
    actions: list[Callable[[], object]] = session.info.pop(_AFTER_COMMIT, [])
    return actions


@event.listens_for(Session, "after_soft_rollback")
def _forget_actions(session: Session, previous_transaction: SessionTransaction) -> None:
    """A rolled-back unit of work runs none of its actions, then or at the session's next commit
    (a savepoint's rollback leaves the enclosing unit's actions in place)."""
    if not previous_transaction.nested:
        session.info.pop(_AFTER_COMMIT, None)
