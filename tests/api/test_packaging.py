"""Static checks of the Dockerfile, compose.yaml, the lock and the commands the README documents
(there is no Docker daemon here)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_is_multi_stage_non_root_and_runs_privrec() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\w+)", text, flags=re.M)
    assert len(stages) >= 2 and "COPY --from=build" in text
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and not users[-1].startswith(("root", "0"))
    assert re.search(r'^ENTRYPOINT \["/usr/bin/tini", "--", "privrec"\]', text, flags=re.M)  # tini is PID 1
    for path in re.findall(r"^COPY\s+(?!--)(\S+)\s", text, flags=re.M):
        assert (ROOT / path).exists(), path


def test_readme_privrec_commands_exist_in_the_cli() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    used = set(re.findall(r"(?:^|/bin/|`)privrec ([a-z][a-z-]+)", (ROOT / "README.md").read_text(), flags=re.M))
    used |= set(re.findall(r"docker run IMAGE ([a-z-]+)", (ROOT / "README.md").read_text()))
    documented = {"serve", "migrate", "api", "worker", "beat", "import-csv", "import-items", "issue-token", "budget", "openapi"}
    assert documented <= commands
    assert used and used <= commands, used - commands


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def _stage(text: str, name: str) -> str:
    """The instructions of one build stage."""
    return re.split(r"^FROM\s", text.split(f" AS {name}\n", 1)[1], maxsplit=1, flags=re.M)[0]


def test_the_dependency_layer_is_keyed_on_the_lock_alone() -> None:
    """The locked requirements are exported in a stage that sees only pyproject.toml and uv.lock; the
    install layer copies nothing but that export, so a README edit cannot rebuild it."""
    text = _dockerfile()
    requirements, build = _stage(text, "requirements"), _stage(text, "build")
    assert re.findall(r"^COPY\s+(.+)$", requirements, flags=re.M) == ["pyproject.toml uv.lock ./"]
    assert "uv export --frozen --no-dev" in requirements
    install = build.index("pip install --require-hashes --no-deps -r /tmp/requirements.txt")
    copies = re.findall(r"^COPY\s+(.+)$", build[:install], flags=re.M)
    assert copies == ["--from=requirements /requirements.txt /tmp/requirements.txt"]
    assert "README.md" in build[install:]
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".venv/", ".venv-*/", ".git/"} <= set(ignored)  # local venvs (3.11, 3.13, uv) stay out of the context


def test_the_image_runs_tini_sets_the_metrics_folder_and_checks_health_per_role() -> None:
    text = _dockerfile()
    runtime = _stage(text, "runtime")
    assert "tini" in runtime and "PROMETHEUS_MULTIPROC_DIR=" in runtime and "BEAT_SCHEDULE_PATH=" in runtime
    checks = re.findall(r"^HEALTHCHECK .*CMD (.+)$", runtime, flags=re.M)
    assert checks == ['["privrec", "healthcheck"]']  # the role PID 1 runs; no HTTP probe for worker or beat
    assert "http" not in checks[0] and "urlopen" not in text


def _compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_validates_against_the_compose_specification() -> None:
    exe = Path(sys.executable).with_name("check-jsonschema")
    done = subprocess.run([str(exe), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_brings_up_every_role_with_its_own_health_check() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "api", "worker", "beat", "dask-scheduler", "dask-worker"}
    for role in ("api", "worker", "beat"):
        service = services[role]
        assert service["command"][0] == role and service["build"] == "."
        assert service["healthcheck"]["test"] == ["CMD", "privrec", "healthcheck", role]
        assert service["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert service["depends_on"]["postgres"] == service["depends_on"]["redis"] == {"condition": "service_healthy"}
        assert "${SECRET_KEY:?" in service["environment"]["SECRET_KEY"]
    assert services["migrate"]["command"] == ["migrate"] and services["migrate"]["restart"] == "no"
    assert services["postgres"]["healthcheck"]["test"][1].startswith("pg_isready")
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert services["api"]["environment"]["ARTIFACT_DIR"] == services["worker"]["environment"]["ARTIFACT_DIR"]
    assert "artifacts:/data" in services["api"]["volumes"] and "artifacts:/data" in services["worker"]["volumes"]


def test_the_dask_profile_runs_a_scheduler_and_two_workers_of_the_image_health_checked() -> None:
    """Issue 28: `docker compose --profile dask up` adds the cluster; the training worker is told its
    address (unset without the profile: in process); no dashboard; spilled data on a tmpfs."""
    services = _compose()["services"]
    scheduler, worker = services["dask-scheduler"], services["dask-worker"]
    for service in (scheduler, worker):
        assert service["profiles"] == ["dask"] and service["build"] == "." and service["image"] == "privrec:latest"
        assert service["command"][0] == "dask" and "--no-dashboard" in service["command"]
        assert service["healthcheck"]["test"][0] == "CMD"
    assert worker["deploy"]["replicas"] == 2 and "/tmp/dask-spill" in worker["tmpfs"]
    assert "tcp://dask-scheduler:8786" in worker["command"]
    from app.core.mf.distributed import WORKER_MALLOC_ENV

    assert worker["environment"] == WORKER_MALLOC_ENV  # the allocator settings the workers were measured with
    assert worker["depends_on"] == {"dask-scheduler": {"condition": "service_healthy"}}
    assert services["worker"]["environment"]["DASK_SCHEDULER_ADDRESS"] == "${DASK_SCHEDULER_ADDRESS:-}"
    assert all("profiles" not in services[role] for role in ("api", "worker", "beat"))
    assert "--extra dask" in _stage(_dockerfile(), "requirements")  # the image carries the extra


def test_every_supported_python_is_locked_and_ci_runs_the_oldest_and_the_newest() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    assert project["requires-python"] == ">=3.11,<3.14"
    assert lock["requires-python"].replace(" ", "") == project["requires-python"]
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    test_command = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest"
    assert test_command in readme and f"\n{test_command}\n" in ci  # the README's test command, verbatim
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/privrec serve" in readme
    assert "uv lock --check" in ci and "export PIP_CONSTRAINT=" in ci
    # the newest Python runs all but the real processes and the Schemathesis run, which the README's
    # command (the last line, every test) runs once
    assert re.search(r"uv sync --frozen --extra dev --python .*\n\.venv-py313/bin/python -m pytest "
                     r"-m \"not e2e and not fuzz\"\n", ci)
    assert ci.rstrip("\n").splitlines()[-1] == test_command


def test_readme_is_a_guide_and_the_benchmarks_live_in_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    for doc in ("docs/benchmarks.md", "docs/design.md", "docs/algorithms.md"):
        assert f"]({doc})" in readme, doc
    for section in ("## Quick start", "## Concepts", "## Privacy model", "## Operations", "## API", "## Architecture"):
        assert f"\n{section}\n" in readme, section
    assert "## Benchmarks" not in readme
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "python -m benchmarks SUITE" in benchmarks and "### CLI start-up" in benchmarks
