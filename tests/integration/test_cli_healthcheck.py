"""``privrec healthcheck worker|beat`` (the containers' health checks) against the real Redis: the
worker's check is its broker, beat's is its broker and a schedule file it keeps rewriting; neither
probes HTTP (``API_PORT`` points at nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXE = str(Path(sys.executable).with_name("privrec"))


def _healthcheck(role: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "healthcheck", role], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_worker_and_beat_healthchecks_probe_the_broker_and_the_schedule(tmp_path: Path, redis_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'h.db'}", "REDIS_URL": redis_url,
           "SECRET_KEY": "healthcheck-tests-secret-0123456789", "API_PORT": "1",
           "BEAT_SCHEDULE_PATH": str(tmp_path / "beat" / "schedule")}
    assert _healthcheck("worker", env, tmp_path).returncode == 0
    done = _healthcheck("beat", env, tmp_path)
    assert done.returncode == 1 and "was not rewritten" in done.stderr  # beat has not written its schedule yet
    (tmp_path / "beat").mkdir()
    (tmp_path / "beat" / "schedule.db").write_bytes(b"")  # the dbm module may add a suffix
    assert _healthcheck("beat", env, tmp_path).returncode == 0
    os.utime(tmp_path / "beat" / "schedule.db", (0, 0))
    assert _healthcheck("beat", env, tmp_path).returncode == 1
    down = {**env, "REDIS_URL": "redis://127.0.0.1:1/0"}
    for role in ("worker", "beat"):
        done = _healthcheck(role, down, tmp_path)
        assert done.returncode == 1 and "broker (REDIS_URL) does not answer" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_beat_schedule_path_is_configurable_and_one_per_database_by_default(tmp_path: Path, redis_url: str) -> None:
    from app.config import Settings
    from workers.celery_app import make_celery

    def schedule(**env: str) -> str:
        return make_celery(Settings(redis_url=redis_url, secret_key="x" * 32, **env)).conf.beat_schedule_filename

    assert schedule(beat_schedule_path=str(tmp_path / "s")) == str(tmp_path / "s")
    one, other = schedule(database_url="sqlite:///a.db"), schedule(database_url="sqlite:///b.db")
    assert one != other and one == schedule(database_url="sqlite:///a.db")
