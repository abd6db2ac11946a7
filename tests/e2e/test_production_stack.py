"""Production path through real HTTP: `privrec migrate`, `privrec api` (uvicorn) and a real
Celery worker (`privrec worker`) on PostgreSQL + Redis: ingest -> train (DPALS) -> publish ->
recommend, then a second run picked up by the running API without restart."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from tests.api.conftest import SMALL_DPALS, create_pg_database, require_postgres
from tests.e2e.conftest import PRIVREC, Proc, base_env, free_port, wait_http, wait_run

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REDIS_URL = os.environ.get("PRIVREC_TEST_E2E_REDIS_URL", "redis://127.0.0.1:6379/13")
SECRET = "e2e-production-secret-0123456789abcdef"


def require_redis() -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception:  # noqa: BLE001
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis is not reachable at {REDIS_URL} under CI=true")
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")


@dataclass
class Stack:
    """`privrec migrate` + `privrec api` + one real Celery worker on a fresh PostgreSQL database."""

    base: str
    env: dict[str, str]
    cwd: Path
    procs: list[Proc]

    def token(self, *args: str) -> dict[str, str]:
        out = subprocess.run([PRIVREC, "issue-token", *args], env=self.env, capture_output=True, text=True,
                             check=True, cwd=self.cwd)
        return {"Authorization": f"Bearer {out.stdout.strip()}"}


@contextmanager
def production_stack(spawn, tmp_path: Path) -> Iterator[Stack]:
    require_postgres()
    require_redis()
    redis.Redis.from_url(REDIS_URL).delete("privrec")  # a stale queue from an aborted run
    url, drop = create_pg_database()
    try:
        env = base_env(DATABASE_URL=url, REDIS_URL=REDIS_URL, SECRET_KEY=SECRET,
                       ARTIFACT_DIR=str(tmp_path / "artifacts"), RUN_HEARTBEAT_S="1", RUN_STALE_AFTER_S="30")
        subprocess.run([PRIVREC, "migrate"], env=env, check=True, cwd=tmp_path, capture_output=True)
        port = free_port()
        api = spawn([PRIVREC, "api", "--port", str(port)], env, "api")
        worker = spawn([PRIVREC, "worker", "--concurrency", "1", "--hostname", f"e2e-{port}@%h"], env, "worker")
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health", api)
        yield Stack(base=base, env=env, cwd=tmp_path, procs=[api, worker])
    finally:
        drop()


def test_ingest_train_publish_recommend_over_http(spawn, tmp_path: Path) -> None:
    with production_stack(spawn, tmp_path) as stack:
        base, env, token, (api, worker) = stack.base, stack.env, stack.token, stack.procs
        admin, svc = token("--admin"), token("--service", "frontend", "--scope", "ingest")
        with httpx.Client(base_url=base, timeout=30) as c:
            assert c.get("/ready").json()["checks"] == {"database": "ok", "broker": "ok"}  # production: the broker too
            for k in range(30):
                r = c.put(f"/v1/datasets/default/items/m{k}", headers=svc,
                          json={"title": f"Movie {k}", "categories": ["even" if k % 2 == 0 else "odd"]})
                assert r.status_code == 201, r.text  # created
            rng = np.random.default_rng(1)
            rows = [{"user_id": f"p{u}", "item_id": f"m{i}", "rating": 5.0 if (u + i) % 2 == 0 else 1.0}
                    for u in range(120) for i in rng.choice(30, size=15, replace=False)]
            r = c.post("/v1/datasets/default/ratings/batch", json={"ratings": rows}, headers=svc)
            assert r.status_code == 200 and r.json()["created"] == len(rows)
            assert c.get("/v1/datasets/default/users/p0/recommendations", headers=token("--user", "p0")
                         ).json()["error"]["code"] == "no_active_model"

            r = c.post("/v1/admin/datasets/default/trainings", headers=admin,
                       json={"epsilon": 2.0, "hyperparameters": SMALL_DPALS})
            assert r.status_code == 202, r.text
            run = wait_run(c, r.json()["run_id"], admin, [api, worker])
            assert run["status"] == "succeeded", (run, worker.tail())
            assert run["progress"] == 1.0 and run["attempts"] >= 1

            info = c.get("/v1/datasets/default/model").json()
            assert info["algorithm"] == "dpals" and info["n_items"] == 30
            reco = c.get("/v1/datasets/default/users/p0/recommendations", params={"n": 5},
                         headers=token("--user", "p0")).json()
            assert reco["model_version"] == info["version"] and reco["fallback"] is False
            assert len(reco["items"]) == 5
            assert c.get("/v1/datasets/default/users/p0/recommendations",
                         headers=token("--user", "p1")).status_code == 403

            # a second run: the running API serves the new version without restart
            r = c.post("/v1/admin/datasets/default/trainings", headers=admin,
                       json={"epsilon_fraction": 0.25, "hyperparameters": SMALL_DPALS})
            run2 = wait_run(c, r.json()["run_id"], admin, [api, worker])
            assert run2["status"] == "succeeded"
            again = c.get("/v1/datasets/default/users/p0/recommendations", headers=token("--user", "p0")).json()
            assert again["model_version"] != info["version"]
            budget = c.get("/v1/admin/datasets/default/budget", headers=admin).json()
            assert budget["runs"]["succeeded"] == 2 and budget["spent_epsilon_rdp"] <= budget["epsilon_cap"]
            out = subprocess.run([PRIVREC, "budget"], env=env, capture_output=True, text=True, check=True, cwd=tmp_path)
            assert '"spent_epsilon_rdp"' in out.stdout


def test_votes_and_public_data_train_on_the_worker(spawn, tmp_path: Path) -> None:
    """Votes randomised on arrival -> a free InP one-bit run on the Celery worker -> a voter's
    P(thumbs up) scores; then a DP-CMF run whose metadata-only item is recommended (cold start)."""
    with production_stack(spawn, tmp_path) as stack:
        admin, svc = stack.token("--admin"), stack.token("--service", "frontend", "--scope", "ingest")
        with httpx.Client(base_url=stack.base, timeout=30) as c:
            # randomised response hides vote values only: the data set and its per-person budget say so
            r = c.put("/v1/admin/person-budgets/votes", headers=admin, json={
                "epsilon_cap": 10.0, "delta": 1e-6, "neighbouring_relation": "replace_vote_values"})
            assert r.status_code == 200, r.text
            r = c.post("/v1/admin/datasets", headers=admin, json={
                "name": "votes", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": 10.0, "delta": 1e-6,
                "neighbouring_relation": "replace_vote_values", "person_budget": "votes"})
            assert r.status_code == 201, r.text
            for k in range(20):
                r = c.put(f"/v1/datasets/votes/items/m{k}", headers=svc,
                          json={"title": f"Movie {k}", "categories": ["even" if k % 2 == 0 else "odd"]})
                assert r.status_code == 201, r.text  # created
            r = c.put("/v1/admin/datasets/votes/vote-settings", headers=admin,
                      json={"local_epsilon": 1.0, "votes_per_user_cap": 4})
            assert r.status_code == 200, r.text
            rng = np.random.default_rng(2)
            rows = [{"user_id": f"v{u}", "item_id": f"m{i}", "vote": 1 if (u + i) % 2 == 0 else -1}
                    for u in range(150) for i in rng.choice(19, size=4, replace=False)]
            r = c.post("/v1/datasets/votes/votes/batch", json={"votes": rows}, headers=svc)
            assert r.status_code == 200 and r.json()["created"] == len(rows)

            r = c.post("/v1/admin/datasets/votes/trainings", headers=admin,
                       json={"algorithm": "onebit", "hyperparameters": {"rank": 2, "n_steps": 20}})
            assert r.status_code == 202, r.text
            run = wait_run(c, r.json()["run_id"], admin, stack.procs)
            assert run["status"] == "succeeded", (run, stack.procs[1].tail())
            reco = c.get("/v1/datasets/votes/users/v0/recommendations", params={"n": 3},
                         headers=stack.token("--user", "v0")).json()
            assert reco["algorithm"] == "onebit" and reco["fallback"] is False
            assert all(0.0 <= x["score"] <= 1.0 for x in reco["items"])
            kinds = [e["kind"] for e in c.get("/v1/admin/datasets/votes/ledger", headers=admin).json()["items"]]
            assert kinds.count("local") == 1

            # DP-CMF: m19 has metadata but no rating; it is recommended from its genre alone
            ratings = [{"user_id": f"p{u}", "item_id": f"m{i}", "rating": 5.0 if (u + i) % 2 == 0 else 1.0}
                       for u in range(120) for i in rng.choice(19, size=10, replace=False)]
            assert c.post("/v1/datasets/votes/ratings/batch", json={"ratings": ratings}, headers=svc).status_code == 200
            hyper = {**SMALL_DPALS, "frequent_fraction": 0.9, "alpha_metadata": 5.0}
            r = c.post("/v1/admin/datasets/votes/trainings", headers=admin,
                       json={"algorithm": "dpcmf", "epsilon": 2.0, "hyperparameters": hyper})
            assert r.status_code == 202, r.text
            run = wait_run(c, r.json()["run_id"], admin, stack.procs)
            assert run["status"] == "succeeded", (run, stack.procs[1].tail())
            info = c.get("/v1/datasets/votes/model").json()
            assert info["algorithm"] == "dpcmf"
            reco = c.get("/v1/datasets/votes/users/p1/recommendations", params={"n": 19},
                         headers=stack.token("--user", "p1")).json()
            assert "m19" in [x["item_id"] for x in reco["items"]]
