"""Token revocation: an admin (route or CLI) cuts off one token by its id without rotating the
secret; every API process refuses it within REVOCATION_REFRESH_S (the one that revoked it at
once), checked with an injected clock; expired entries are pruned."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app import cli
from app.auth import REVOCATION_REFRESH_S, RevocationList, issue_token
from app.config import reset_settings_cache
from app.db.session import dispose_engines
from app.main import create_app
from app.services import revocations
from tests.api.conftest import SECRET, Env

REVOKE = "/v1/admin/tokens/revocations"
RATINGS = "/v1/datasets/default/users/alice/ratings"
RECOMMEND = "/v1/datasets/default/users/alice/recommendations"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def other_process(env: Env, clock: FakeClock) -> Iterator[TestClient]:
    """A second API app on the same database, as another process would run it, whose revocation
    list reads time from ``clock``."""
    app = create_app(env.settings)
    app.state.revocations = RevocationList(clock=clock)
    with TestClient(app) as client:
        yield client


def _code(r) -> str:  # type: ignore[no-untyped-def]
    return r.json()["error"]["code"]


def test_a_revoked_token_is_refused_at_once_here_and_within_the_bound_elsewhere(env: Env) -> None:
    leaked = env.token("alice")
    kept = env.token("alice")
    bearer = {"Authorization": f"Bearer {leaked}"}
    clock = FakeClock()
    with other_process(env, clock) as other:
        assert other.get(RATINGS, headers=bearer).status_code == 200  # verified and cached there
        r = env.client.post(REVOKE, json={"token": leaked, "reason": "leaked in a log"}, headers=env.admin)
        assert r.status_code == 201, r.text
        assert r.json()["status"] == "revoked" and r.json()["reason"] == "leaked in a log"
        again = env.client.post(REVOKE, json={"token": leaked}, headers=env.admin)
        assert again.status_code == 200 and again.json()["status"] == "already_revoked"

        # the revoking process refuses it at once, on the routed path and on the fast path
        r = env.client.get(RATINGS, headers=bearer)
        assert r.status_code == 401 and _code(r) == "token_revoked"
        r = env.client.get(RECOMMEND, headers=bearer)
        assert r.status_code == 401 and _code(r) == "token_revoked"
        assert env.client.get(RATINGS, headers={"Authorization": f"Bearer {kept}"}).status_code == 200

        # another process may still accept it until its list is REVOCATION_REFRESH_S old, never after
        clock.now += REVOCATION_REFRESH_S - 0.01
        assert other.get(RATINGS, headers=bearer).status_code == 200
        clock.now += 0.01
        r = other.get(RECOMMEND, headers=bearer)  # the fast path reloads the list too
        assert r.status_code == 401 and _code(r) == "token_revoked"
        assert _code(other.get(RATINGS, headers=bearer)) == "token_revoked"
        assert other.get(RATINGS, headers={"Authorization": f"Bearer {kept}"}).status_code == 200


def test_the_list_age_counts_from_before_its_read() -> None:
    """A revocation committed while the list was being read may be missing from it; the list's age
    counts from the read's start, so the next reload (at most refresh_s later) sees it."""
    clock = FakeClock()
    revoked: set[str] = set()
    reads: list[float] = []

    def load() -> set[str]:
        reads.append(clock.now)
        clock.now += 2.0  # a slow read
        return set(revoked)

    rl = RevocationList(refresh_s=5.0, clock=clock)
    assert not rl.is_fresh()
    rl.reload(load)
    assert rl.is_fresh() and reads == [1000.0]
    rl.reload(load)  # fresh: not read again
    assert reads == [1000.0]
    revoked.add("j1")
    clock.now = 1000.0 + 4.99
    assert rl.is_fresh() and not rl.is_revoked("j1")
    clock.now = 1005.0
    assert not rl.is_fresh()
    rl.reload(load)
    assert rl.is_revoked("j1")
    rl.add("j2")
    assert rl.is_revoked("j2")


def test_revoke_by_id_and_refusals(sqlite_env: Env) -> None:
    env = sqlite_env
    token = env.token("alice")
    token_id = json.loads(_payload(token))["jti"]
    r = env.client.post(REVOKE, json={"token_id": token_id}, headers=env.admin)
    assert r.status_code == 201, r.text
    held_until = datetime.fromisoformat(r.json()["expires_at"])
    assert held_until >= datetime.now(UTC) + timedelta(seconds=env.settings.max_token_ttl_s - 60)
    assert _code(env.client.get(RATINGS, headers={"Authorization": f"Bearer {token}"})) == "token_revoked"
    for bad in ({}, {"token": token, "token_id": token_id}, {"token_id": "a b"}, {"token": "x" * 5000}):
        r = env.client.post(REVOKE, json=bad, headers=env.admin)
        assert r.status_code == 422 and _code(r) == "validation_error", bad
    foreign = issue_token("alice", secret="another-secret-0123456789abcdef")
    r = env.client.post(REVOKE, json={"token": foreign}, headers=env.admin)
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "token"]
    assert env.client.post(REVOKE, json={"token_id": "x"}, headers=env.auth("alice")).status_code == 403
    assert env.client.post(REVOKE, json={"token_id": "x"}).status_code == 401
    assert env.count("revoked_tokens") == 1


def test_a_revoked_admin_token_opens_no_dashboard_session(sqlite_env: Env) -> None:
    env = sqlite_env
    admin = env.token("root", "admin")
    assert env.client.post(REVOKE, json={"token": admin}, headers=env.admin).status_code == 201
    assert env.client.post("/dashboard/session", json={"token": admin}).status_code == 401


def test_expired_entries_are_pruned(sqlite_env: Env) -> None:
    env = sqlite_env
    now = datetime.now(UTC)
    with env.session() as s:
        revocations.revoke(s, token_id="old", expires_at=int(now.timestamp()) + 10, actor="t")
        revocations.revoke(s, token_id="live", expires_at=int(now.timestamp()) + 3600, actor="t")
        s.commit()
        assert sorted(revocations.revoked_ids(s)) == ["live", "old"]
        later = now + timedelta(seconds=60)
        assert revocations.revoked_ids(s, now=later) == ["live"]  # an expired token needs no entry
        revocations.revoke(s, token_id="new", expires_at=int(later.timestamp()) + 3600, actor="t", now=later)
        s.commit()
    assert env.count("revoked_tokens") == 2  # "old" was pruned on the way


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("SECRET_KEY", SECRET)
    monkeypatch.delenv("REDIS_URL", raising=False)
    reset_settings_cache()
    yield tmp_path
    dispose_engines()
    reset_settings_cache()


def test_cli_revoke_token(cli_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from app.config import get_settings
    from app.db.session import get_sessionmaker

    assert cli.main(["migrate"]) == 0
    token = issue_token("alice", secret=SECRET, ttl_seconds=600)
    capsys.readouterr()
    assert cli.main(["revoke-token", token, "--reason", "lost laptop"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "revoked" and out["token_id"] == json.loads(_payload(token))["jti"]
    assert abs(datetime.fromisoformat(out["expires_at"]).timestamp() - (time.time() + 600)) < 120
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(token + "\n"))
    assert cli.main(["revoke-token", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "already_revoked"
    assert cli.main(["revoke-token", "--id", "abc123"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit, match="not a token this service signed"):
        cli.main(["revoke-token", issue_token("alice", secret="another-secret-0123456789abcdef")])
    with pytest.raises(SystemExit):
        cli.main(["revoke-token", "--id", "bad id"])
    with get_sessionmaker(get_settings().database_url)() as s:
        assert sorted(revocations.revoked_ids(s)) == sorted([out["token_id"], "abc123"])


def _payload(token: str) -> str:
    import base64

    part = token.split(".")[1]
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode()


def test_a_revocation_is_held_no_longer_than_any_token_can_live() -> None:
    from app.auth import revocation_target

    token = issue_token("alice", secret=SECRET, ttl_seconds=3600, now=1_000_000)
    token_id, expires_at = revocation_target(token, secret=SECRET, now=1_000_000)
    assert expires_at == 1_003_600 and token_id
    assert revocation_target(token, secret=SECRET, max_lifetime_s=60, now=1_000_000)[1] == 1_000_060
