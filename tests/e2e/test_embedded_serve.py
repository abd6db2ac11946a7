"""The README's embedded command: `privrec serve` on SQLite with no Redis answers /health,
seeds the demo data set, trains it in-process and recommends."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import PRIVREC, ROOT, base_env, free_port, wait_http, wait_run

pytestmark = pytest.mark.e2e


def _readme_serve_command() -> str:
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    cmds = [line for line in lines if line.startswith("python3 -m venv .venv") and line.endswith("privrec serve")]
    assert len(cmds) == 1, "the README must show exactly one embedded `privrec serve` command"
    return cmds[0]


def test_readme_commands() -> None:
    """Exactly two set-up commands; the test command is the one CI runs, byte for byte."""
    text = (ROOT / "README.md").read_text()
    ci_last = (ROOT / ".ci" / "run").read_text().rstrip("\n").splitlines()[-1]
    assert ci_last in text.splitlines()
    assert _readme_serve_command() == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/privrec serve")


def test_embedded_serve_end_to_end(spawn, tmp_path: Path) -> None:
    assert _readme_serve_command().endswith(".venv/bin/privrec serve")
    port = free_port()
    env = base_env()
    proc = spawn([PRIVREC, "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)], env, "serve")
    base = f"http://127.0.0.1:{port}"
    assert wait_http(f"{base}/health", proc, timeout=90).json()["status"] == "ok"
    assert httpx.get(f"{base}/ready").json()["checks"] == {"database": "ok", "embedded_worker": "ok"}

    def token(*args: str) -> dict[str, str]:
        out = subprocess.run([PRIVREC, "issue-token", *args], env={**env, "DATABASE_URL": "sqlite://"},
                             capture_output=True, text=True, check=True, cwd=tmp_path)
        return {"Authorization": f"Bearer {out.stdout.strip()}"}

    admin = token("--admin")
    with httpx.Client(base_url=base, timeout=30) as client:
        runs = client.get("/v1/admin/datasets/default/trainings", headers=admin).json()
        assert runs["total"] == 1 and runs["items"][0]["trigger"] == "demo"
        run = wait_run(client, runs["items"][0]["id"], admin, [proc])
        assert run["status"] == "succeeded", run
        assert client.get("/v1/datasets/default/items", params={"limit": 1}).json()["total"] == 500
        reco = client.get("/v1/datasets/default/users/user-5/recommendations", params={"n": 5},
                          headers=token("--user", "user-5")).json()
        assert reco["fallback"] is False and len(reco["items"]) == 5 and reco["model_version"] >= 1
        assert client.get("/v1/datasets/default/users/user-5/recommendations",
                          headers=token("--user", "user-6")).status_code == 403
        budget = client.get("/v1/admin/datasets/default/budget", headers=admin).json()
        assert 0 < budget["spent_epsilon_rdp"] <= budget["epsilon_cap"]
