"""Real processes: a Celery worker (PostgreSQL + Redis) trains, a redelivered task charges once,
and a worker killed with SIGKILL mid-run leaves the run failed, its reservation spent and the
active model untouched (also for a bare training process on SQLite)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app import model_store
from app.config import Settings
from app.db.models import LedgerEntry, ModelVersion, TrainingRun
from app.db.session import session_scope
from app.services import budget
from app.services.training import dispatch, runner
from app.services.training import requests as train_requests
from tests.integration.platform_helpers import create_dataset, make_settings, seed_ratings, synthetic_ratings

REPO = Path(__file__).resolve().parents[2]
SMALL = {"rank": 4, "n_steps": 2, "contribution_bound": 20}
SLOW = {"rank": 128, "n_steps": 200, "contribution_bound": 50, "frequent_fraction": 1.0}


def _env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=settings.database_url,
        ARTIFACT_DIR=str(settings.artifact_dir),
        SECRET_KEY=settings.secret_key,
        RUN_HEARTBEAT_S=str(settings.run_heartbeat_s),
        RUN_STALE_AFTER_S=str(settings.run_stale_after_s),
        RETRAIN_INTERVAL_S=str(settings.retrain_interval_s),
        RETRAIN_EPSILON=str(settings.retrain_epsilon),
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    if settings.redis_url:
        env["REDIS_URL"] = settings.redis_url
    else:
        env.pop("REDIS_URL", None)
    return env


def _status(url: str, run_id: int) -> TrainingRun:
    with session_scope(url) as s:
        return s.get(TrainingRun, run_id)


def _wait(url: str, run_id: int, cond, timeout: float = 120.0) -> TrainingRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _status(url, run_id)
        if cond(run):
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} never reached the expected state: {run.status} {run.stage} {run.progress}")


def _kinds(url: str, run_id: int) -> list[str]:
    with session_scope(url) as s:
        return list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id).order_by(LedgerEntry.seq)))


def _start_worker(settings: Settings, tmp_path: Path, name: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", dispatch.QUEUE,
        "-c", "1", "-n", f"{name}@%h", "--loglevel=INFO", "--without-gossip", "--without-mingle",
    ]
    with open(tmp_path / f"{name}.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=REPO, env=_env(settings), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(timeout=30)


def _queue_drained(redis_url: str) -> bool:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return client.llen(dispatch.QUEUE) == 0 and client.hlen("unacked") == 0
    finally:
        client.close()


@pytest.mark.integration
@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_celery_worker_trains_charges_once_and_survives_a_kill(pg_url, redis_url, tmp_path):
    settings = make_settings(
        tmp_path, pg_url, redis_url=redis_url, secret_key=secrets.token_hex(24),
        run_heartbeat_s=0.5, run_stale_after_s=3.0,
    )
    create_dataset(pg_url, cap=20.0)
    seed_ratings(pg_url, "default", synthetic_ratings(2000, 400, 40_000))
    worker = _start_worker(settings, tmp_path, "w1")
    try:
        # 1. request -> Celery -> train -> publish
        first = train_requests.submit_training(
            url=pg_url, settings=settings, dataset="default", epsilon=1.0, hyperparameters=SMALL, actor="admin"
        )
        run = _wait(pg_url, first, lambda r: r.status in ("succeeded", "failed"))
        assert run.status == "succeeded", (run.error, (tmp_path / "w1.log").read_text()[-3000:])
        with session_scope(pg_url) as s:
            active = model_store.get_active_version(s, "default")
            assert active.run_id == first
            spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp

        # 2. the broker delivers the same task twice more: no second charge, no second model
        for _ in range(2):
            dispatch.enqueue_run(first, settings=settings)
        deadline = time.monotonic() + 60
        while not _queue_drained(redis_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _queue_drained(redis_url)
        assert _kinds(pg_url, first) == ["reservation", "commit"]
        with session_scope(pg_url) as s:
            assert s.scalar(select(func.count()).select_from(ModelVersion)) == 1
            assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == spent
            assert s.get(TrainingRun, first).attempts == 1

        # 3. a long run; the worker is killed (SIGKILL, whole process group) mid-training
        slow = train_requests.submit_training(
            url=pg_url, settings=settings, dataset="default", epsilon=1.0, hyperparameters=SLOW, actor="admin"
        )
        _wait(pg_url, slow, lambda r: r.status == "running" and r.progress > 0.1, timeout=180)
        _kill(worker)
        run = _status(pg_url, slow)
        assert run.status == "running" and run.private_data_read  # past the read: charged whatever happens
        with session_scope(pg_url) as s:
            spent_with_slow = budget.get_budget(s, dataset="default").spent_epsilon_rdp
        assert spent_with_slow > spent

        # 4. the same node starts again at once: its start-up fails the run its dead incarnation
        #    held, without waiting for a stale heartbeat, a redelivery or a beat
        worker = _start_worker(settings, tmp_path, "w1")
        run = _wait(pg_url, slow, lambda r: r.status == "failed", timeout=60)
        assert "vanished" in run.error and not run.refunded
        assert _kinds(pg_url, slow) == ["reservation"]  # counted as spent, charged once
        with session_scope(pg_url) as s:
            assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == spent_with_slow
            row, _model = model_store.get_active_model(s, "default")
            assert row.id == active.id  # the active model is untouched
            assert s.scalar(select(func.count()).select_from(ModelVersion)) == 1
    finally:
        _kill(worker)


_TRAIN_SCRIPT = """
import sys
from app.config import Settings
from app.services.training.runner import run_training
settings = Settings(database_url=sys.argv[1], artifact_dir=sys.argv[3], run_heartbeat_s=0.5, run_stale_after_s=3.0)
print(run_training(int(sys.argv[2]), url=sys.argv[1], settings=settings), flush=True)
"""


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_killed_training_process_fails_closed(db_url, tmp_path):
    settings = make_settings(tmp_path, db_url, run_heartbeat_s=0.5, run_stale_after_s=3.0)
    create_dataset(db_url, cap=20.0)
    seed_ratings(db_url, "default", synthetic_ratings(2000, 400, 40_000))
    first = train_requests.submit_training(url=db_url, settings=settings, dataset="default", epsilon=1.0,
                                     hyperparameters=SMALL, actor="admin")
    assert runner.run_training(first, url=db_url, settings=settings) == "succeeded"
    slow = train_requests.submit_training(url=db_url, settings=settings, dataset="default", epsilon=1.0,
                                    hyperparameters=SLOW, actor="admin")
    with session_scope(db_url) as s:
        spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp
        active_id = model_store.get_active_version(s, "default").id
    proc = subprocess.Popen(
        [sys.executable, "-c", _TRAIN_SCRIPT, db_url, str(slow), str(settings.artifact_dir)],
        cwd=REPO, env=_env(settings), start_new_session=True,
    )
    try:
        _wait(db_url, slow, lambda r: r.status == "running" and r.progress > 0.1, timeout=180)
    finally:
        _kill(proc)
    assert runner.reap_stale_runs(url=db_url, settings=settings) == []  # heartbeat still fresh
    time.sleep(settings.run_stale_after_s + 0.5)
    assert runner.reap_stale_runs(url=db_url, settings=settings) == [slow]
    run = _status(db_url, slow)
    assert run.status == "failed" and not run.refunded
    assert _kinds(db_url, slow) == ["reservation"]
    assert runner.run_training(slow, url=db_url, settings=settings) == "failed"  # redelivery: no-op
    with session_scope(db_url) as s:
        assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == spent
        assert model_store.get_active_version(s, "default").id == active_id


def _scheduled_runs(url: str) -> list[TrainingRun]:
    with session_scope(url) as s:
        return list(s.scalars(select(TrainingRun).where(TrainingRun.trigger == "schedule").order_by(TrainingRun.id)))


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.integration
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_celery_beat_retrains_on_schedule_from_public_facts_within_budget(pg_url, redis_url, tmp_path):
    settings = make_settings(
        tmp_path, pg_url, redis_url=redis_url, secret_key=secrets.token_hex(24),
        run_heartbeat_s=0.5, run_stale_after_s=3.0, retrain_interval_s=2, retrain_epsilon=0.5,
    )
    create_dataset(pg_url, cap=20.0)
    seed_ratings(pg_url, "default", synthetic_ratings())
    worker = _start_worker(settings, tmp_path, "wb")
    with open(tmp_path / "beat.log", "w") as beat_log:  # the child keeps its own descriptor
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", "--loglevel=INFO",
             "--schedule", str(tmp_path / "beat-schedule")],
            cwd=REPO, env=_env(settings), stdout=beat_log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_for(lambda: [r.status for r in _scheduled_runs(pg_url)][:1] == ["succeeded"], 120, "the first scheduled run")
        # nothing changed: retrained all the same (whether data changed is not public)
        _wait_for(lambda: [r.status for r in _scheduled_runs(pg_url)][:2] == ["succeeded"] * 2, 120, "a second run")
        with session_scope(pg_url) as s:
            budget.change_cap(s, dataset="default", new_cap=budget.get_budget(s, dataset="default").spent_epsilon_rdp + 0.01,
                              reason=None, actor="admin")
        _wait_for(lambda: all(r.status in ("succeeded", "failed") for r in _scheduled_runs(pg_url)), 120, "runs to end")
        n_runs = len(_scheduled_runs(pg_url))
        with session_scope(pg_url) as s:
            spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp
        time.sleep(3 * settings.retrain_interval_s + 1)  # the budget would be exceeded: no more runs
        assert len(_scheduled_runs(pg_url)) == n_runs
        with session_scope(pg_url) as s:
            assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == spent
            assert model_store.get_active_version(s, "default").run_id == _scheduled_runs(pg_url)[-1].id
    finally:
        _kill(beat)
        _kill(worker)


@pytest.mark.integration
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_run_lost_with_a_restarted_redis_is_trained_by_a_real_worker(pg_url, redis_url, tmp_path):
    """A run sent while no worker listened, then lost with the broker (a non-persistent Redis
    restarting: the test flushes it): a real worker starting a minute later re-sends it (its
    message is no longer with the broker) and trains it, charged once."""
    import redis

    settings = make_settings(tmp_path, pg_url, redis_url=redis_url, secret_key=secrets.token_hex(24),
                             run_heartbeat_s=1.0, run_stale_after_s=30.0)
    create_dataset(pg_url, cap=10.0)
    seed_ratings(pg_url, "default", synthetic_ratings())
    run_id = train_requests.submit_training(settings=settings, url=pg_url, dataset="default", epsilon=1.0,
                                            hyperparameters=SMALL, actor="admin")
    broker = redis.Redis.from_url(redis_url)
    try:
        assert broker.llen(dispatch.QUEUE) == 1
        broker.flushdb()  # the broker restarts empty
    finally:
        broker.close()
    with session_scope(pg_url) as s:  # sent a minute and a half ago
        s.get_one(TrainingRun, run_id).enqueued_at = TrainingRun.enqueued_at - func.make_interval(0, 0, 0, 0, 0, 0, 90)
    worker = _start_worker(settings, tmp_path, "wl")
    try:
        run = _wait(pg_url, run_id, lambda r: r.status in ("succeeded", "failed"), timeout=180)
        assert run.status == "succeeded", (tmp_path / "wl.log").read_text()[-3000:]
        assert _kinds(pg_url, run_id) == ["reservation", "commit"]
    finally:
        _kill(worker)
