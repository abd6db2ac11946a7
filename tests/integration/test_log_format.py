"""One log format across the processes: ``privrec api``, a Celery worker (``privrec worker``) and
beat (``privrec beat``) on PostgreSQL + Redis write one JSON object per stderr line with a UTC
timestamp, and the training task's lines carry the request id of the API request that started
it. The processes run in a time zone 5:30 ahead of UTC, so a local time labelled UTC shows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from app.auth import issue_token
from tests.api.conftest import SMALL_DPALS
from tests.integration.platform_helpers import create_dataset, seed_ratings, synthetic_ratings

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

PRIVREC = str(Path(sys.executable).with_name("privrec"))
SECRET = "log-format-secret-0123456789abcdef"
RID = "trace-0123456789abcdef"
LOCAL_TZ = "PRV-05:30"  # POSIX TZ: local time is UTC + 5:30
SLACK = timedelta(minutes=5)  # far below the zone's offset
TRAININGS = "/v1/admin/datasets/{dataset}/trainings"


@dataclass
class Logged:
    """A child process whose stderr (its log) goes to a file; stdout (Celery's banner) apart."""

    name: str
    proc: subprocess.Popen[bytes]
    stderr: Path

    def lines(self) -> list[dict]:
        """Every stderr line, parsed as one JSON object (fails on a line that is not one)."""
        out = []
        for raw in self.stderr.read_text(errors="replace").splitlines():
            if raw.strip():
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    pytest.fail(f"{self.name} wrote a line that is not JSON: {raw!r}")
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def _start(args: list[str], env: dict[str, str], tmp_path: Path, name: str) -> Logged:
    err = tmp_path / f"{name}.err"
    with open(err, "wb") as stderr, open(tmp_path / f"{name}.out", "wb") as stdout:
        proc = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=stdout, stderr=stderr, start_new_session=True)
    return Logged(name, proc, err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, cond: Callable[[], object], procs: list[Logged], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.proc.poll() is not None:
                pytest.fail(f"{p.name} exited with {p.proc.returncode}:\n{p.stderr.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if cond():
                return
        time.sleep(0.3)
    tails = "\n---\n".join(f"{p.name}:\n{p.stderr.read_text()[-2000:]}" for p in procs)
    pytest.fail(f"{what} did not happen within {timeout}s:\n{tails}")


def _check_format(logged: Logged, since: datetime) -> list[dict]:
    """Each line holds ts (UTC, ``Z``), level, logger and msg; its time lies between the test's
    start and now in UTC (a local time 5:30 ahead would not)."""
    lines = logged.lines()
    assert lines, f"{logged.name} logged nothing"
    now = datetime.now(UTC)
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= line.keys(), (logged.name, line)
        assert line["ts"].endswith("Z"), (logged.name, line)
        ts = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
        assert since - SLACK <= ts <= now + SLACK, (logged.name, line, since, now)
    return lines


def _has(logged: Logged, pred: Callable[[dict], bool]) -> bool:
    return any(pred(line) for line in logged.lines())


def _train_succeeded(line: dict) -> bool:
    return str(line["msg"]).startswith("Task privrec.train_run[") and str(line["msg"]).endswith("succeeded")


@pytest.mark.timeout(420)
def test_api_worker_and_beat_log_one_json_format_and_one_request_id(pg_url, redis_url, tmp_path):
    create_dataset(pg_url, cap=20.0)
    seed_ratings(pg_url, "default", synthetic_ratings(200, 40, 2000))
    env = {k: v for k, v in os.environ.items() if k not in {"LOG_FORMAT", "LOG_LEVEL", "PROMETHEUS_MULTIPROC_DIR"}}
    env.update(DATABASE_URL=pg_url, REDIS_URL=redis_url, SECRET_KEY=SECRET, ARTIFACT_DIR=str(tmp_path / "artifacts"),
               SEED_DEMO="false", BEAT_SCHEDULE_PATH=str(tmp_path / "beat-schedule"), TZ=LOCAL_TZ,
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", RUN_HEARTBEAT_S="1")
    since = datetime.now(UTC)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    procs = [_start([PRIVREC, "api", "--port", str(port)], env, tmp_path, "api"),
             _start([PRIVREC, "worker", "--concurrency", "1", "--hostname", f"logs-{port}@%h"], env, tmp_path, "worker"),
             _start([PRIVREC, "beat"], env, tmp_path, "beat")]
    api, worker, beat = procs
    admin = {"Authorization": f"Bearer {issue_token('root', secret=SECRET, kind='admin', ttl_seconds=600)}"}
    try:
        _until("the API answering", lambda: httpx.get(f"{base}/health", timeout=2).status_code == 200, procs)
        r = httpx.post(f"{base}/v1/admin/datasets/default/trainings", headers={**admin, "X-Request-ID": RID},
                       json={"epsilon": 1.0, "hyperparameters": SMALL_DPALS}, timeout=30)
        assert r.status_code == 202 and r.headers["x-request-id"] == RID, r.text
        run = f"{base}/v1/admin/trainings/{r.json()['run_id']}"
        _until("the run succeeding", lambda: httpx.get(run, headers=admin, timeout=5).json()["status"] == "succeeded",
               procs)
        _until("the worker's line for the task", lambda: _has(worker, _train_succeeded), procs, timeout=30)
        _until("beat's start", lambda: _has(beat, lambda line: "Starting" in str(line["msg"])), procs, timeout=60)
    finally:
        for p in procs:
            p.stop()

    api_lines, worker_lines, beat_lines = (_check_format(p, since) for p in procs)
    assert any(line["logger"] == "privrec.access" and line.get("request_id") == RID
               and line["http"]["route"] == TRAININGS and line["http"]["status"] == 202 for line in api_lines)
    traced = [line for line in worker_lines if line.get("request_id") == RID]
    assert any(_train_succeeded(line) for line in traced), worker_lines
    assert all(line.get("request_id") in (None, RID) for line in worker_lines)
    assert not any("privrec.reap_stale_runs" in str(line["msg"]) for line in traced)  # unbound after the task
    assert any(line["logger"] == "celery.beat" for line in beat_lines), beat_lines
