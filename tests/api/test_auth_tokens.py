"""Unit tests of the token module (no database)."""

from __future__ import annotations

import time

import jwt
import pytest

from app.auth import TokenError, decode_token, issue_token

SECRET = "unit-secret-0123456789abcdef-0123456789"


def test_round_trip_user_token() -> None:
    p = decode_token(issue_token("alice", secret=SECRET), secret=SECRET)
    assert (p.subject, p.kind, p.scopes) == ("alice", "user", frozenset())
    assert p.may_act_for("alice") and not p.may_act_for("bob")
    assert not p.is_admin


def test_service_and_admin_scopes() -> None:
    svc = decode_token(issue_token("front", secret=SECRET, kind="service", scopes=["act_for_users"]), secret=SECRET)
    assert svc.may_act_for("anyone") and not svc.may_ingest_for("anyone") and not svc.is_admin
    adm = decode_token(issue_token("root", secret=SECRET, kind="admin"), secret=SECRET)
    assert adm.is_admin and not adm.may_act_for("alice")


def test_expired_token_refused() -> None:
    token = issue_token("alice", secret=SECRET, ttl_seconds=1, now=time.time() - 100)
    with pytest.raises(TokenError, match="expired"):
        decode_token(token, secret=SECRET)


def test_tampered_and_foreign_tokens_refused() -> None:
    token = issue_token("alice", secret=SECRET)
    head, payload, sig = token.split(".")
    forged = jwt.encode({"sub": "bob", "typ": "user", "iss": "privrec", "iat": 1, "exp": 2**40}, "x" * 32,
                        algorithm="HS256")
    with pytest.raises(TokenError):
        decode_token(head + "." + forged.split(".")[1] + "." + sig, secret=SECRET)
    with pytest.raises(TokenError):
        decode_token(forged, secret=SECRET)
    with pytest.raises(TokenError):
        decode_token(token, secret=SECRET + "x")
    unsigned = jwt.encode({"sub": "x", "typ": "admin", "scope": "admin", "iss": "privrec", "iat": 1,
                           "exp": 2**40}, None, algorithm="none")
    with pytest.raises(TokenError):
        decode_token(unsigned, secret=SECRET)


def test_scope_rules_enforced_on_issue_and_decode() -> None:
    with pytest.raises(ValueError):
        issue_token("alice", secret=SECRET, scopes=["ingest"])  # user tokens carry no scopes
    with pytest.raises(ValueError):
        issue_token("svc", secret=SECRET, kind="service", scopes=["admin"])
    with pytest.raises(ValueError):
        issue_token("svc", secret="short")
    smuggled = jwt.encode({"sub": "svc", "typ": "service", "scope": "admin", "iss": "privrec", "iat": 1,
                           "exp": 2**40}, SECRET, algorithm="HS256")
    with pytest.raises(TokenError):
        decode_token(smuggled, secret=SECRET)


def test_every_token_carries_an_id_and_one_without_is_refused() -> None:
    p1 = decode_token(issue_token("alice", secret=SECRET, ttl_seconds=60, now=time.time()), secret=SECRET)
    p2 = decode_token(issue_token("alice", secret=SECRET), secret=SECRET)
    assert p1.token_id and p2.token_id and p1.token_id != p2.token_id
    assert abs(p1.expires_at - (time.time() + 60)) < 5
    unnamed = jwt.encode({"sub": "alice", "typ": "user", "iss": "privrec", "iat": int(time.time()),
                          "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    with pytest.raises(TokenError):  # it could not be revoked
        decode_token(unnamed, secret=SECRET)
