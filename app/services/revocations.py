"""Token revocations, the use case: an admin cuts off a token id (``jti``) until the token's
expiry; API processes refresh the ids in force (:mod:`app.auth`). The rows live in
:mod:`app.db.stores.revocations`; nothing here commits: the caller's unit of work does."""

from __future__ import annotations

from app.db.stores.revocations import expiry_of, prune_expired, revoke, revoked_ids

__all__ = ["revoke", "revoked_ids", "prune_expired", "expiry_of"]
