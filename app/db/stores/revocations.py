"""Revoked token ids (``jti``): record one as cut off until the token's expiry, list the
ids still in force, prune the rest. Nothing here commits: the caller's unit of work does."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.models import RevokedToken, as_aware, utcnow

__all__ = ["revoke", "revoked_ids", "prune_expired"]


def revoke(session: Session, *, token_id: str, expires_at: int, actor: str, reason: str | None = None,
           now: datetime | None = None) -> tuple[RevokedToken, bool]:
    """Record ``token_id`` as revoked until ``expires_at`` (seconds since the epoch); ``(row,
    created)``, where ``created`` is false when it was already revoked (the row is unchanged).
    Entries whose token has expired are pruned on the way."""
    now = now or utcnow()
    prune_expired(session, now=now)
    row = session.get(RevokedToken, token_id)
    if row is not None:
        return row, False
    row = RevokedToken(jti=token_id, expires_at=datetime.fromtimestamp(expires_at, UTC), revoked_at=now,
                       actor=actor, reason=reason)
    session.add(row)
    session.flush()
    return row, True


def revoked_ids(session: Session, *, now: datetime | None = None) -> list[str]:
    """The ids of revoked tokens that have not expired yet."""
    return list(session.scalars(select(RevokedToken.jti).where(RevokedToken.expires_at > (now or utcnow()))))


def prune_expired(session: Session, *, now: datetime | None = None) -> int:
    """Delete the entries whose token has expired (such a token is refused anyway); how many."""
    result = session.execute(delete(RevokedToken).where(RevokedToken.expires_at <= (now or utcnow()))
                             .execution_options(synchronize_session=False))
    return int(getattr(result, "rowcount", 0) or 0)


def expiry_of(row: RevokedToken) -> datetime:
    """The row's expiry as an aware UTC timestamp (SQLite stores naive ones)."""
    return as_aware(row.expires_at)
