"""Signed, expiring bearer tokens (JWT, HS256).

Three kinds of principal:

* ``user``    – subject is the user's external id; may act only for that user.
* ``service`` – subject names the calling service; scopes grant rights, e.g. ``act_for_users``
  (read recommendations/ratings for any user) and ``ingest`` (write ratings and items).
* ``admin``   – carries the ``admin`` scope; reaches the admin routes.

Expired or tampered tokens, and tokens whose lifetime (``exp - iat``) exceeds the maximum, raise
:class:`TokenError` (rendered as 401 by the API).

Every token carries a random id (``jti``). A token is cut off before its expiry by listing its id
as revoked (a database table); each API process holds the list in a :class:`RevocationList` that
is at most :data:`REVOCATION_REFRESH_S` seconds old when a token is checked against it.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import jwt

__all__ = [
    "ALGORITHM",
    "MAX_LIFETIME_S",
    "ISSUER",
    "SCOPE_ACT_FOR_USERS",
    "SCOPE_INGEST",
    "SCOPE_ADMIN",
    "KNOWN_SCOPES",
    "Principal",
    "TokenError",
    "issue_token",
    "decode_token",
    "decode_token_cached",
    "revocation_target",
    "RevocationList",
    "REVOCATION_REFRESH_S",
]

ALGORITHM = "HS256"
ISSUER = "privrec"
SCOPE_ACT_FOR_USERS = "act_for_users"
SCOPE_INGEST = "ingest"
SCOPE_ADMIN = "admin"
MAX_LIFETIME_S = 30 * 24 * 3600  # default bound on exp - iat (settings: MAX_TOKEN_TTL_S)
KNOWN_SCOPES = frozenset({SCOPE_ACT_FOR_USERS, SCOPE_INGEST, SCOPE_ADMIN})
Kind = Literal["user", "service", "admin"]
_KINDS = ("user", "service", "admin")


class TokenError(Exception):
    """The token is missing, malformed, tampered with or expired."""


@dataclass(frozen=True)
class Principal:
    """Who is calling, as proven by a verified token."""

    subject: str
    kind: Kind
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: str = ""
    """The token's ``jti`` (what a revocation names)."""
    expires_at: int = 0
    """The token's ``exp`` (seconds since the epoch)."""

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin" and SCOPE_ADMIN in self.scopes

    def may_act_for(self, user_id: str) -> bool:
        """True for the user themself or a service holding ``act_for_users``."""
        if self.kind == "user":
            return self.subject == user_id
        return self.kind == "service" and SCOPE_ACT_FOR_USERS in self.scopes

    def may_ingest_for(self, user_id: str) -> bool:
        """True for the user themself or a service holding ``ingest``."""
        if self.kind == "user":
            return self.subject == user_id
        return self.kind == "service" and SCOPE_INGEST in self.scopes

    @property
    def may_manage_items(self) -> bool:
        """Items are catalogue data: services with ``ingest`` and admins may write them."""
        return self.is_admin or (self.kind == "service" and SCOPE_INGEST in self.scopes)


def _check_secret(secret: str) -> None:
    if not secret or len(secret) < 16:
        raise ValueError("the token secret must be at least 16 characters")


def issue_token(subject: str, *, secret: str, kind: Kind = "user", scopes: Iterable[str] = (),
                ttl_seconds: int = 3600, now: float | None = None, algorithm: str = ALGORITHM,
                max_lifetime_s: int = MAX_LIFETIME_S) -> str:
    """Sign a token for ``subject`` valid for ``ttl_seconds`` (at most ``max_lifetime_s``)."""
    _check_secret(secret)
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}")
    if not subject or not isinstance(subject, str):
        raise ValueError("subject must be a non-empty string")
    if ttl_seconds <= 0:
        raise ValueError("ttl_seconds must be positive")
    if ttl_seconds > max_lifetime_s:
        raise ValueError(f"ttl_seconds must not exceed the maximum token lifetime ({max_lifetime_s} s)")
    scope_set = set(scopes)
    unknown = scope_set - KNOWN_SCOPES
    if unknown:
        raise ValueError(f"unknown scope(s): {sorted(unknown)}")
    if kind == "admin":
        scope_set.add(SCOPE_ADMIN)
    elif SCOPE_ADMIN in scope_set:
        raise ValueError("only admin tokens carry the admin scope")
    if kind == "user" and scope_set:
        raise ValueError("user tokens carry no scopes")
    issued = int(now if now is not None else time.time())
    claims = {
        "iss": ISSUER,
        "sub": subject,
        "typ": kind,
        "scope": " ".join(sorted(scope_set)),
        "iat": issued,
        "exp": issued + int(ttl_seconds),
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, secret, algorithm=algorithm)


def decode_token(token: str, *, secret: str, algorithm: str = ALGORITHM, leeway: float = 0.0,
                 max_lifetime_s: int = MAX_LIFETIME_S) -> Principal:
    """Verify signature, issuer, expiry and lifetime (``exp - iat <= max_lifetime_s``, so a
    token signed with a longer life than configured is refused); return the principal or raise
    :class:`TokenError`."""
    return _principal(_verified_claims(token, secret=secret, algorithm=algorithm, leeway=leeway,
                                       max_lifetime_s=max_lifetime_s))


def decode_token_cached(token: str, *, secret: str, algorithm: str = ALGORITHM,
                        max_lifetime_s: int = MAX_LIFETIME_S) -> Principal:
    """:func:`decode_token` for the request path: a verified token is remembered in this process
    for at most ``VERIFIED_TTL_S`` seconds and never past its own ``exp`` (tokens cannot be
    revocation is checked on every use, against :class:`RevocationList`, so this changes no answer);
    refused tokens are never remembered."""
    key = (token, secret, algorithm, max_lifetime_s)
    hit = _verified.get(key)
    now = time.time()
    if hit is not None and now < hit[1]:
        return hit[0]
    claims = _verified_claims(token, secret=secret, algorithm=algorithm, max_lifetime_s=max_lifetime_s)
    principal = _principal(claims)
    with _verified_lock:
        if len(_verified) >= VERIFIED_CAPACITY:
            _verified.clear()
        _verified[key] = (principal, min(float(claims["exp"]), now + VERIFIED_TTL_S))
    return principal


VERIFIED_TTL_S = 30.0
VERIFIED_CAPACITY = 50_000
_verified: dict[tuple[str, str, str, int], tuple[Principal, float]] = {}
_verified_lock = threading.Lock()


def _verified_claims(token: str, *, secret: str, algorithm: str, max_lifetime_s: int,
                     leeway: float = 0.0) -> dict:
    """The claims of a token whose signature, issuer, expiry and lifetime check out."""
    try:
        claims = jwt.decode(
            token, secret, algorithms=[algorithm], issuer=ISSUER, leeway=leeway,
            options={"require": ["exp", "iat", "sub", "iss", "typ", "jti"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise TokenError("token expired") from exc
    except jwt.InvalidTokenError as exc:
        raise TokenError("invalid token") from exc
    if not _lifetime_within(claims, max_lifetime_s):
        raise TokenError("token lifetime exceeds the maximum")
    return claims


def _principal(claims: dict) -> Principal:
    """The principal named by verified ``claims`` (TokenError on an unknown kind or scope misuse)."""
    kind = claims.get("typ")
    subject = claims.get("sub")
    if kind not in _KINDS or not isinstance(subject, str) or not subject:
        raise TokenError("invalid token claims")
    scopes = frozenset(s for s in str(claims.get("scope", "")).split() if s)
    if SCOPE_ADMIN in scopes and kind != "admin":
        raise TokenError("invalid token claims")
    token_id = claims.get("jti")
    if not _valid_token_id(token_id):
        raise TokenError("invalid token claims")
    return Principal(subject=subject, kind=kind, scopes=scopes, token_id=str(token_id),
                     expires_at=int(claims["exp"]))


MAX_TOKEN_ID_LENGTH = 64


def _valid_token_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_TOKEN_ID_LENGTH


def revocation_target(token: str, *, secret: str, algorithm: str = ALGORITHM,
                      max_lifetime_s: int = MAX_LIFETIME_S, now: float | None = None) -> tuple[str, int]:
    """``(jti, exp)`` of a token this service signed (a bearer token or a dashboard session),
    whether or not it has expired: what revoking it records. ``exp`` is capped at ``now +
    max_lifetime_s`` (no token verifies beyond that: ``iat`` may not lie ahead and ``exp - iat`` is
    bounded). :class:`TokenError` when the signature or issuer does not check out or the claims are
    missing."""
    try:
        claims = jwt.decode(token, secret, algorithms=[algorithm], issuer=ISSUER,
                            options={"require": ["exp", "jti", "iss"], "verify_exp": False, "verify_aud": False})
    except jwt.InvalidTokenError as exc:
        raise TokenError("invalid token") from exc
    exp = claims["exp"]
    if (not _valid_token_id(claims["jti"]) or isinstance(exp, bool) or not isinstance(exp, (int, float))
            or not math.isfinite(exp)):
        raise TokenError("invalid token claims")
    latest = int(now if now is not None else time.time()) + max_lifetime_s
    return str(claims["jti"]), int(min(exp, latest))


REVOCATION_REFRESH_S = 5.0
"""The most a process's revocation list may lag the database: a token revoked at time t is refused
by every API process from t + REVOCATION_REFRESH_S on (at once in the process that revoked it)."""


class RevocationList:
    """One process's copy of the revoked token ids, with the time its database read began.

    :meth:`is_fresh` is true while that read began less than ``refresh_s`` ago on ``clock``; a
    verifier reloads a stale list (:meth:`reload`) before it trusts it, so no verified token, cached
    or not, outlives its revocation by more than ``refresh_s`` seconds."""

    def __init__(self, *, refresh_s: float = REVOCATION_REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self.clock = clock
        self._ids: frozenset[str] = frozenset()
        self._loaded_at: float | None = None
        self._lock = threading.Lock()

    def is_fresh(self) -> bool:
        """True when the list was read from the database less than ``refresh_s`` ago."""
        return self._loaded_at is not None and self.clock() - self._loaded_at < self.refresh_s

    def is_revoked(self, token_id: str) -> bool:
        return token_id in self._ids

    def add(self, token_id: str) -> None:
        """Record a revocation this process just committed (refused here at once)."""
        with self._lock:
            self._ids = self._ids | {token_id}

    def reload(self, load: Callable[[], Iterable[str]]) -> None:
        """Replace the list with ``load()`` (the revoked ids the database holds) unless another
        thread did so meanwhile; the list's age counts from before the read."""
        with self._lock:
            if self.is_fresh():
                return
            started = self.clock()
            self._ids = frozenset(load())
            self._loaded_at = started


def _lifetime_within(claims: dict[str, Any], max_lifetime_s: int) -> bool:
    """True when ``exp`` and ``iat`` are numbers with ``0 < exp - iat <= max_lifetime_s``."""
    exp, iat = claims.get("exp"), claims.get("iat")
    if not (isinstance(exp, (int, float)) and isinstance(iat, (int, float))) or isinstance(exp, bool) or isinstance(iat, bool):
        return False
    return 0 < exp - iat <= max_lifetime_s
