"""One commit per request or task, and what must wait for it.

Services never commit: they stage their writes on the caller's ``Session`` and register what may
only happen once those writes are durable (dropping a cache that would otherwise be refilled from
the old rows, handing a run to the workers) with :func:`after_commit`. The unit of work's owner
(the write-session dependency of a route, a CLI command, a task) calls :func:`commit` once.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

__all__ = ["after_commit", "commit"]

_AFTER_COMMIT = "privrec.after_commit"


def after_commit(session: Session, action: Callable[[], object]) -> None:
    """Run ``action`` right after this session's unit of work commits (never if it rolls back)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(action)


@event.listens_for(Session, "after_soft_rollback")
def _forget_actions(session: Session, previous_transaction: SessionTransaction) -> None:
    """A rolled-back unit of work runs none of its actions, then or at the session's next commit
    (a savepoint's rollback leaves the enclosing unit's actions in place)."""
    if not previous_transaction.nested:
        session.info.pop(_AFTER_COMMIT, None)


def commit(session: Session) -> None:
    """Commit the unit of work, then run its after-commit actions in registration order."""
    session.commit()
    for action in session.info.pop(_AFTER_COMMIT, []):
        action()
