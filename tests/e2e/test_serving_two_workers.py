"""Two real API processes on one PostgreSQL database: the per-process serving caches (the
active model, each user's folded-in state) never serve stale answers. A rating written, a user
deleted or a model activated through one process is seen by the other on its very next request.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.db.session import dispose_engines
from app.main import create_app
from tests.api.conftest import (
    SECRET,
    Env,
    _bootstrap,
    create_pg_database,
    make_settings,
    require_postgres,
    seed_ratings,
    train_and_publish,
)
from tests.e2e.conftest import PRIVREC, base_env, free_port, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REDIS_URL = os.environ.get("PRIVREC_TEST_E2E_REDIS_URL", "redis://127.0.0.1:6379/13")
R = "/v1/datasets/default"


def _reco(client: httpx.Client, env: Env, user: str) -> dict:
    r = client.get(f"{R}/users/{user}/recommendations", params={"n": 8}, headers=env.auth(user))
    assert r.status_code == 200, r.text
    return r.json()


def test_writes_deletes_and_activations_reach_every_worker(spawn, tmp_path: Path) -> None:
    require_postgres()
    url, drop = create_pg_database()
    try:
        settings = make_settings(url, tmp_path)
        _bootstrap(settings)
        with TestClient(create_app(settings)) as local:
            env = Env(settings=settings, client=local)
            seed_ratings(env)
            first = train_and_publish(env)
            second = train_and_publish(env, hyper={"rank": 4, "frequent_fraction": 1.0, "contribution_bound": 30,
                                                   "reg_item": 8.0})
            assert second != first
            proc_env = base_env(DATABASE_URL=url, REDIS_URL=REDIS_URL, SECRET_KEY=SECRET,
                                ARTIFACT_DIR=str(settings.artifact_dir), SEED_DEMO="false")
            bases = []
            for name in ("a", "b"):
                port = free_port()
                proc = spawn([PRIVREC, "api", "--port", str(port)], proc_env, f"api-{name}")
                bases.append(f"http://127.0.0.1:{port}")
                wait_http(f"{bases[-1]}/health", proc)
            with httpx.Client(base_url=bases[0], timeout=30) as a, httpx.Client(base_url=bases[1], timeout=30) as b:
                _check_rating_write(env, a, b)
                _check_concurrent_reads(env, bases[0], b)
                _check_activation(env, a, b, first)
                _check_user_deletion(env, a, b)
    finally:
        dispose_engines()
        drop()


def _check_rating_write(env: Env, a: httpx.Client, b: httpx.Client) -> None:
    """A rating written through B drops the rated item from A's next list and changes A's state."""
    before_a, before_b = _reco(a, env, "u0"), _reco(b, env, "u0")  # both processes cache u0's state
    assert before_a == before_b and before_a["fallback"] is False
    top = before_a["items"][0]["item_id"]
    r = b.put(f"{R}/users/u0/ratings/{top}", json={"rating": 1.0}, headers=env.auth("u0"))
    assert r.status_code in (200, 201), r.text
    after_a = _reco(a, env, "u0")
    assert top not in {x["item_id"] for x in after_a["items"]}
    assert after_a == _reco(b, env, "u0") == _reco(env.client, env, "u0")  # same answer everywhere


def _check_concurrent_reads(env: Env, base_a: str, b: httpx.Client) -> None:
    """Concurrent requests to A (its reads grouped into shared statements) right after a write
    through B: every user gets exactly B's answer for that user, the writer's changed one included."""
    users = [f"u{k}" for k in range(6)]
    top = _reco(b, env, "u3")["items"][0]["item_id"]
    r = b.put(f"{R}/users/u3/ratings/{top}", json={"rating": 2.0}, headers=env.auth("u3"))
    assert r.status_code in (200, 201), r.text

    def burst(user: str) -> list[dict]:
        with httpx.Client(base_url=base_a, timeout=30) as client:
            return [_reco(client, env, user) for _ in range(3)]

    with ThreadPoolExecutor(len(users) * 2) as pool:
        answers = list(pool.map(burst, users * 2))
    for user, got in zip(users * 2, answers, strict=True):
        assert all(answer == _reco(b, env, user) for answer in got)
    assert all(top not in {x["item_id"] for x in answer["items"]} for answer in answers[3] + answers[9])


def _check_activation(env: Env, a: httpx.Client, b: httpx.Client, older: int) -> None:
    """Activating the older version through B: A's next answer comes from that version."""
    assert _reco(a, env, "u1")["model_version"] != older
    r = b.post(f"{R}/models/{older}/activate".replace("/v1/", "/v1/admin/"), headers=env.admin)
    assert r.status_code == 200, r.text
    assert _reco(a, env, "u1")["model_version"] == older
    assert _reco(a, env, "u1") == _reco(b, env, "u1")


def _check_user_deletion(env: Env, a: httpx.Client, b: httpx.Client) -> None:
    """A user deleted through B gets the no-data fallback from A at once."""
    assert _reco(a, env, "u2")["fallback"] is False
    r = b.delete("/v1/users/u2", headers=env.auth("u2"))
    assert r.status_code == 200, r.text
    after = _reco(a, env, "u2")
    assert after["fallback"] is True and after["fallback_reason"] == "dp_popular: user has no ratings"
