"""SIGTERM stops `privrec serve` and a Celery worker (`privrec worker`) while a long training run is
in progress (the issue: `serve` did not stop within 20 s of SIGTERM with such a run): the process
exits before a generous timeout, and the run, stopped at its next progress point after reading
private data, is failed and charged instead of training on. The signal goes to the main process
only, as `docker stop` through tini sends it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import PRIVREC, Proc, base_env, free_port, wait_http
from tests.e2e.test_production_stack import production_stack

pytestmark = pytest.mark.e2e

STOP_TIMEOUT_S = 90.0  # generous: the process only has to exit before this, however loaded the machine
# the largest step count at a large rank: minutes of training, so only a stop ends it in time
LONG = {"rank": 128, "n_steps": 1_000, "frequent_fraction": 1.0, "contribution_bound": 30}


def _seed(client: httpx.Client, svc: dict[str, str], n_items: int = 150, n_users: int = 300) -> None:
    for k in range(n_items):
        assert client.put(f"/v1/datasets/default/items/m{k}", headers=svc, json={"title": f"M{k}"}).status_code == 201
    rng = np.random.default_rng(3)
    rows = [{"user_id": f"p{u}", "item_id": f"m{i}", "rating": float(1 + (u + i) % 5)}
            for u in range(n_users) for i in rng.choice(n_items, size=20, replace=False)]
    r = client.post("/v1/datasets/default/ratings/batch", json={"ratings": rows}, headers=svc)
    assert r.status_code == 200, r.text


def _start_long_run(client: httpx.Client, admin: dict[str, str], procs: list[Proc]) -> int:
    r = client.post("/v1/admin/datasets/default/trainings", headers=admin,
                    json={"epsilon": 2.0, "hyperparameters": LONG})
    assert r.status_code == 202, r.text
    run_id = int(r.json()["run_id"])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        run = client.get(f"/v1/admin/trainings/{run_id}", headers=admin).json()
        if run["private_data_read"] and (run["stage"] or "").startswith("training"):
            return run_id
        assert run["status"] in ("queued", "running"), run
        time.sleep(0.1)
    pytest.fail("the run did not start training:\n" + "\n---\n".join(p.tail() for p in procs))


def _sigterm_and_wait(proc: Proc) -> None:
    os.kill(proc.p.pid, signal.SIGTERM)
    try:
        proc.p.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_TIMEOUT_S:.0f} s after SIGTERM:\n{proc.tail()}")


def _assert_stopped_and_charged(run: dict[str, Any]) -> None:
    assert run["status"] == "failed" and "interrupted" in run["error"], run
    assert run["private_data_read"] and not run["refunded"]  # it had read: charged, never refunded


def test_serve_stops_on_sigterm_during_a_long_run(spawn, tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "data"
    env = base_env()
    proc = spawn([PRIVREC, "serve", "--data-dir", str(data), "--port", str(port), "--no-demo"], env, "serve")
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health", proc, timeout=90)

    def token(*args: str) -> dict[str, str]:
        out = subprocess.run([PRIVREC, "issue-token", *args], env={**env, "DATABASE_URL": "sqlite://"},
                             capture_output=True, text=True, check=True, cwd=tmp_path)
        return {"Authorization": f"Bearer {out.stdout.strip()}"}

    admin = token("--admin")
    with httpx.Client(base_url=base, timeout=30) as client:
        _seed(client, token("--service", "loader", "--scope", "ingest"))
        run_id = _start_long_run(client, admin, [proc])
    _sigterm_and_wait(proc)
    with sqlite3.connect(data / "privrec.db") as db:
        db.row_factory = sqlite3.Row
        row = dict(db.execute("SELECT status, error, private_data_read, refunded FROM training_runs WHERE id = ?",
                              (run_id,)).fetchone())
    _assert_stopped_and_charged(row)


@pytest.mark.integration
def test_a_celery_worker_stops_on_sigterm_during_a_long_run(spawn, tmp_path: Path) -> None:
    with production_stack(spawn, tmp_path) as stack:
        api, worker = stack.procs
        admin = stack.token("--admin")
        with httpx.Client(base_url=stack.base, timeout=30) as client:
            _seed(client, stack.token("--service", "loader", "--scope", "ingest"))
            run_id = _start_long_run(client, admin, stack.procs)
            _sigterm_and_wait(worker)
            _assert_stopped_and_charged(client.get(f"/v1/admin/trainings/{run_id}", headers=admin).json())
