"""End-to-end helpers: real processes (uvicorn via `privrec`, a Celery worker) over real HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRIVREC = str(Path(sys.executable).with_name("privrec"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process whose output goes to a log file (shown when a test fails)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.log = log
        with open(log, "wb") as out:  # the child keeps its own descriptor
            self.p = subprocess.Popen(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def stop(self, timeout: float = 15.0) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(5)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def _spawn(args: list[str], env: dict[str, str], name: str) -> Proc:
        proc = Proc(args, env, tmp_path / f"{name}.log", tmp_path)
        procs.append(proc)
        return proc

    yield _spawn
    for proc in reversed(procs):
        proc.stop()


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ARTIFACT_DIR", "SEED_DEMO"}}
    env.update({"PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1"})
    env.update(extra)
    return env


def wait_http(url: str, proc: Proc, timeout: float = 60.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            pytest.fail(f"process exited with {proc.p.returncode}:\n{proc.tail()}")
        try:
            r = httpx.get(url, timeout=2.0)
            if r.status_code == 200:
                return r
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{url} did not answer within {timeout}s:\n{proc.tail()}")


def wait_run(client: httpx.Client, run_id: int, headers: dict[str, str], procs: list[Proc],
             timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    seen_progress = set()
    while time.monotonic() < deadline:
        run = client.get(f"/v1/admin/trainings/{run_id}", headers=headers).json()
        seen_progress.add(run["progress"])
        if run["status"] in ("succeeded", "failed"):
            run["_seen_progress"] = sorted(seen_progress)
            return run
        time.sleep(0.5)
    logs = "\n---\n".join(p.tail() for p in procs)
    pytest.fail(f"run {run_id} did not finish within {timeout}s:\n{logs}")
