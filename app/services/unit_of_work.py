"""One commit per request or task, and what must wait for it.

Services never commit: they stage their writes on the caller's ``Session`` and register what may
only happen once those writes are durable (dropping a cache that would otherwise be refilled from
the old rows, handing a run to the workers) with :func:`after_commit`. The unit of work's owner
(the write-session dependency of a route, a CLI command, a task) calls :func:`commit` once. A
unit of work that rolls back runs none of its actions (:mod:`app.db.after_commit`).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from app.db.after_commit import hold, take

__all__ = ["after_commit", "commit"]


def after_commit(session: Session, action: Callable[[], object]) -> None:
    """Run ``action`` right after this session's unit of work commits (never if it rolls back)."""
    hold(session, action)


def commit(session: Session) -> None:
    """Commit the unit of work, then run its after-commit actions in registration order."""
    session.commit()
    for action in take(session):
        action()
