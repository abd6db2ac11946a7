"""Cancelling a training run (POST /v1/admin/trainings/{id}/cancel, `privrec cancel-run`): a queued
run is refunded, a run that has read private data stays charged; the worker holding a running run
stops at its next progress point and publishes nothing; idempotent; 404 and 409 documented."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from app.services.training.runner import clear_shutdown, request_shutdown, run_training
from tests.api.conftest import SMALL_DPALS, Env, seed_ratings, train_and_publish

A = "/v1/admin/datasets/default"
LONG = {**SMALL_DPALS, "rank": 32, "n_steps": 1_000}  # the largest step count: seconds of training, cancelled mid-run


def _start(env: Env, hyper: dict[str, Any] | None = None) -> int:
    r = env.client.post(f"{A}/trainings", headers=env.admin,
                        json={"epsilon": 1.0, "hyperparameters": hyper or SMALL_DPALS,
                              "idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 202, r.text
    return int(r.json()["run_id"])


def _run(env: Env, run_id: int) -> dict[str, Any]:
    return env.client.get(f"/v1/admin/trainings/{run_id}", headers=env.admin).json()


def _cancel(env: Env, run_id: int) -> Any:
    return env.client.post(f"/v1/admin/trainings/{run_id}/cancel", headers=env.admin)


def _ledger_kinds(env: Env, run_id: int) -> list[str]:
    items = env.client.get(f"{A}/ledger", headers=env.admin, params={"limit": 1000}).json()["items"]
    return [e["kind"] for e in items if e["run_id"] == run_id]


def _spent(env: Env) -> float:
    return float(env.client.get(f"{A}/budget", headers=env.admin).json()["spent_epsilon_rdp"])


def _in_background(env: Env, run_id: int) -> tuple[threading.Thread, list[str]]:
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(
        run_training(run_id, url=env.settings.database_url, settings=env.settings)), daemon=True)
    worker.start()
    return worker, outcome


def _wait_training(env: Env, run_id: int, worker: threading.Thread, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until the run has read private data and trains (or the worker ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.is_alive():
        run = _run(env, run_id)
        if run["private_data_read"] and run["stage"].startswith("training"):
            return run
        time.sleep(0.02)
    pytest.fail(f"run {run_id} did not start training: {_run(env, run_id)}")


def test_a_queued_run_is_cancelled_refunded_and_never_trained(env: Env) -> None:
    seed_ratings(env)
    run_id = _start(env)
    assert _spent(env) > 0
    r = _cancel(env, run_id)
    assert r.status_code == 200, r.text
    run = r.json()
    assert (run["status"], run["stage"], run["cancelled"], run["refunded"]) == ("failed", "cancelled", True, True)
    assert not run["private_data_read"] and "refunded" in run["error"] and run["finished_at"]
    assert _spent(env) == 0 and _ledger_kinds(env, run_id) == ["reservation", "refund"]
    again = _cancel(env, run_id)  # idempotent: the same answer, no second refund
    assert again.status_code == 200 and again.json() == run
    assert _ledger_kinds(env, run_id) == ["reservation", "refund"]
    # a worker that receives the message later finds a finished run: nothing trains, nothing is published
    assert run_training(run_id, url=env.settings.database_url, settings=env.settings) == "failed"
    assert _run(env, run_id) == run
    assert env.client.get("/v1/datasets/default/model").json()["error"]["code"] == "no_active_model"


def test_a_running_run_that_read_private_data_stays_charged_and_publishes_nothing(env: Env) -> None:
    seed_ratings(env)
    run_id = _start(env, LONG)
    worker, outcome = _in_background(env, run_id)
    _wait_training(env, run_id, worker)
    r = _cancel(env, run_id)
    assert r.status_code == 200, r.text
    worker.join(120)
    assert not worker.is_alive() and outcome == ["cancelled"]  # stopped at a progress point
    run = _run(env, run_id)
    assert (run["status"], run["stage"], run["cancelled"], run["refunded"]) == ("failed", "cancelled", True, False)
    assert run["private_data_read"] and "charged" in run["error"] and run["progress"] < 0.9
    assert _ledger_kinds(env, run_id) == ["reservation"]  # charged: never refunded, never committed
    assert _spent(env) > 0
    assert env.client.get(f"{A}/models", headers=env.admin).json()["total"] == 0
    assert _cancel(env, run_id).json() == run  # idempotent


def test_unknown_and_finished_runs_are_404_and_409(env: Env) -> None:
    r = _cancel(env, 10**9)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_training_run"
    seed_ratings(env)
    train_and_publish(env)
    done = env.client.get(f"{A}/trainings", headers=env.admin).json()["items"][0]
    r = _cancel(env, done["id"])
    assert r.status_code == 409 and r.json()["error"]["code"] == "run_finished"
    assert _run(env, done["id"])["status"] == "succeeded"
    r = env.client.post(f"/v1/admin/trainings/{done['id']}/cancel", headers=env.auth("u1"))
    assert r.status_code == 403


def test_a_shutting_down_process_stops_its_run(env: Env) -> None:
    """SIGTERM's path in a Celery pool process (``request_shutdown``): the run stops at its next
    progress point; having read private data, it is failed and charged (category ``interrupted``)."""
    seed_ratings(env)
    run_id = _start(env, LONG)
    worker, outcome = _in_background(env, run_id)
    try:
        _wait_training(env, run_id, worker)
        request_shutdown()
        worker.join(120)
    finally:
        clear_shutdown()
    assert not worker.is_alive() and outcome == ["interrupted"]
    run = _run(env, run_id)
    assert run["status"] == "failed" and not run["refunded"] and "interrupted" in run["error"]
    assert not run["cancelled"] and _ledger_kinds(env, run_id) == ["reservation"]


def test_a_run_stopped_before_its_private_read_goes_back_to_the_queue(env: Env) -> None:
    """A worker already stopping claims nothing it cannot finish: the run it took is queued again,
    unsent (the outbox sends it to the next worker), its reservation kept, nothing refunded."""
    seed_ratings(env)
    run_id = _start(env)
    stopping = threading.Event()
    stopping.set()
    outcome = run_training(run_id, url=env.settings.database_url, settings=env.settings, stop=stopping)
    assert outcome == "interrupted"
    run = _run(env, run_id)
    assert (run["status"], run["stage"], run["enqueued"], run["refunded"]) == ("queued", "queued", False, False)
    assert not run["private_data_read"] and run["attempts"] == 1 and _ledger_kinds(env, run_id) == ["reservation"]
    assert run_training(run_id, url=env.settings.database_url, settings=env.settings) == "succeeded"
