"""Hostile requests against a real server: server CPU per request and ``/health`` beside it.

Set-up: ``privrec serve --no-demo`` (embedded SQLite, one uvicorn process) in a subprocess, one
admin and one ingest token. Each case sends one hostile request while a thread polls ``/health``
every 20 ms; it measures the server process's CPU seconds over the request (``/proc``:
utime + stime, all of its threads), the answer's status and size, and the slowest ``/health``
answer during it.

Cases (the target in the ``baseline`` column: < 1 s of server CPU, ``/health`` answering):
* ``rows-100k-bad``: a ratings batch of 100,000 rows, each with a bad rating (~3.5 MB; refused by
  its row count before validation).
* ``keys-500k``: a training body with 500,000 unknown keys (~10 MB; refused by the training
  route's 64 KiB limit before it is read).
* ``keys-2k``: a training body with 2,000 unknown keys (~30 kB; refused by its key count).
* ``rows-10k-3-bad-fields``: the worst body within the ratings batch's shape limits (40,064
  values): 10,000 rows, every field wrong (~0.4 MB; validated in the worker thread: 30,000
  errors, a bounded 422 listing 20 of them).
* ``items-nested``: deep nesting in a training body (refused by its depth).

Rows per case: ``server_cpu_s`` (baseline 1.0), ``health_max_ms``, ``response_bytes``,
``status``. Cost: one server start (~5 s) and five requests, under a minute; no PostgreSQL.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from benchmarks.harness import SuiteUnavailable, make_row

SUITE = "hostile"
SECRET = "hostile-bench-secret-0123456789abcdef"
CPU_TARGET_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_server(data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "SECRET_KEY": SECRET, "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--no-demo", "--data-dir", str(data_dir),
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code in (200, 503):
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.terminate()
    raise SuiteUnavailable("privrec serve did not start")


def _tokens() -> dict[str, dict[str, str]]:
    from app.auth import issue_token

    admin = issue_token("bench", secret=SECRET, kind="admin", ttl_seconds=3600)
    ingest = issue_token("bench", secret=SECRET, kind="service", scopes=("ingest", "act_for_users"), ttl_seconds=3600)
    return {"admin": {"Authorization": f"Bearer {admin}"}, "ingest": {"Authorization": f"Bearer {ingest}"}}


def _cases(tokens: dict[str, dict[str, str]]) -> list[tuple[str, str, bytes, dict[str, str]]]:
    bad_rows = [{"user_id": f"u{k}", "item_id": "i0", "rating": "bad"} for k in range(100_000)]
    wide_rows = [{"user_id": [], "item_id": {}, "rating": "r"} for _ in range(10_000)]
    nested: object = 0
    for _ in range(200):
        nested = [nested]
    json_headers = {"Content-Type": "application/json"}
    return [
        ("rows-100k-bad", "/v1/datasets/default/ratings/batch",
         json.dumps({"ratings": bad_rows}).encode(), {**tokens["ingest"], **json_headers}),
        ("keys-500k", "/v1/admin/datasets/default/trainings",
         json.dumps({"epsilon": 1.0, **{f"key{k}": k for k in range(500_000)}}).encode(),
         {**tokens["admin"], **json_headers}),
        ("keys-2k", "/v1/admin/datasets/default/trainings",
         json.dumps({"epsilon": 1.0, **{f"key{k}": k for k in range(2_000)}}).encode(),
         {**tokens["admin"], **json_headers}),
        ("rows-10k-3-bad-fields", "/v1/datasets/default/ratings/batch",
         json.dumps({"ratings": wide_rows}).encode(), {**tokens["ingest"], **json_headers}),
        ("items-nested", "/v1/admin/datasets/default/trainings",
         json.dumps({"epsilon": 1.0, "hyperparameters": {"x": nested}, "pad": "p" * 20_000}).encode(),
         {**tokens["admin"], **json_headers}),
    ]


def _health_poller(base: str, stop: threading.Event, worst: list[float]) -> Callable[[], None]:
    def poll() -> None:
        with httpx.Client(timeout=120) as client:
            while True:  # at least one answer, however short the request
                t0 = time.perf_counter()
                client.get(f"{base}/health")
                worst[0] = max(worst[0], (time.perf_counter() - t0) * 1000)
                if stop.wait(0.02):
                    break

    return poll


def _measure(proc: subprocess.Popen, base: str, path: str, body: bytes,
             headers: dict[str, str]) -> tuple[float, float, int, int, float]:
    """(server CPU s, slowest /health ms, status, response bytes, wall s) of one request."""
    stop, worst = threading.Event(), [0.0]
    poller = threading.Thread(target=_health_poller(base, stop, worst))
    cpu0 = _cpu_seconds(proc.pid)
    poller.start()
    t0 = time.perf_counter()
    r = httpx.post(f"{base}{path}", content=body, headers=headers, timeout=600)
    wall = time.perf_counter() - t0
    stop.set()
    poller.join()
    return _cpu_seconds(proc.pid) - cpu0, worst[0], r.status_code, len(r.content), wall


def run(quick: bool) -> list[dict]:
    del quick  # one size: the cases are the issue's
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="privrec-hostile-") as tmp:
        proc, base = _start_server(Path(tmp) / "data")
        try:
            for name, path, body, headers in _cases(_tokens()):
                cpu, health_ms, status, size, wall = _measure(proc, base, path, body, headers)
                label = f"{name} ({len(body) / 1e3:,.0f} kB)"
                rows += [
                    make_row(SUITE, label, "api", "server_cpu_s", cpu, baseline=CPU_TARGET_S, seconds=wall),
                    make_row(SUITE, label, "api", "health_max_ms", health_ms, seconds=wall),
                    make_row(SUITE, label, "api", "response_bytes", size, seconds=wall),
                    make_row(SUITE, label, "api", "status", status, seconds=wall),
                ]
        finally:
            proc.terminate()
            proc.wait(30)
    return rows
