"""Serving latency and throughput over real HTTP, next to /health in the same run.

Set-up: PostgreSQL data set with 20,000 items and production-shaped synthetic ratings; one real
DPALS run (rank 64) through the training service publishes the model; then ``privrec api``
(uvicorn, one worker process per core unless ``BENCH_SERVE_WORKERS`` says otherwise) serves it.
Every recommendation is for a random user with that user's own token.

Phases and rows (targets on the 2-core machine in the ``baseline`` column):
* ``closed-loop-32``: 32 keep-alive clients, each sending its next request when the last one
  answered; ``requests_per_second`` for recommendations (target 1,000) and for ``/health`` (the
  same-run ceiling of the same workers), ``p50_ms``/``p99_ms``, ``server_p50_ms`` (time inside
  the app, ``Server-Timing``; the suite turns the opt-in header on) and ``cpu_ms_per_request``
  (the API processes' CPU seconds over the phase, read from /proc, per request).
* ``open-loop-500rps``: recommendations offered at a constant 500 requests/s whatever the server
  does; latency counted from each request's due time, so queueing is not hidden (no coordinated
  omission); ``p50_ms``, ``p99_ms`` (target 20), ``achieved_rps``, ``cpu_ms_per_request``.
* ``all-phases``/``loadgen_cpu_fraction``: the share of the machine's CPU the load generator used,
  so a generator that starves the server of the cores cannot go unnoticed.

Environment: ``BENCH_SERVE_WORKERS`` (API processes), ``BENCH_SERVE_REDIS_URL`` (the API's Redis,
default db 15), ``BENCH_SERVE_LOG`` (keep the server's log).
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.harness import make_row

SUITE = "serve"
N_ITEMS = 20_000
RANK = 64
CLIENTS = 32
OPEN_LOOP_RATE = 500.0
_TIMING = re.compile(r"app;dur=([0-9.]+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prepare(url: str, quick: bool, settings) -> list[str]:
    """Load items + ratings, train and publish a rank-64 DPALS model; return user ids."""
    from app.core.data.synthetic import production_synthetic
    from app.db.migrate import upgrade_head
    from app.db.session import get_sessionmaker
    from app.services import budget, catalog, ingest
    from app.services.training import requests as train_requests
    from app.services.training import runner

    upgrade_head(url)
    maker = get_sessionmaker(url)
    n_users, n_ratings = (4_000, 200_000) if quick else (10_000, 400_000)
    data = production_synthetic(n_users, N_ITEMS, n_ratings, rank=16, seed=11)
    coo = data.ratings.csr.tocoo()
    users = [f"user-{int(u)}" for u in np.asarray(data.ratings.user_ids)[coo.row]]
    items = [f"item-{int(i)}" for i in np.asarray(data.ratings.item_ids)[coo.col]]
    values = np.clip(coo.data, 0.5, 5.0).tolist()
    with maker() as s:
        budget.bootstrap(s, settings)
        s.commit()
    with maker() as s:  # the public 20,000-item catalogue first (items nobody rated included)
        catalog.import_items(s, dataset="default", rows=[(f"item-{i}", f"item-{i}", []) for i in range(N_ITEMS)])
        s.commit()
    for k in range(0, len(users), 50_000):
        with maker() as s:
            ingest.import_ratings(s, dataset="default", rows=list(zip(users[k:k + 50_000], items[k:k + 50_000],
                                                                      values[k:k + 50_000], strict=True)))
            s.commit()
    hyper = {"rank": RANK, "n_steps": 1, "frequent_fraction": 0.25 if quick else 0.4}
    with maker() as s:
        run = train_requests.start_training(s, dataset="default", epsilon=2.0, hyperparameters=hyper, actor="bench")
        s.commit()
        run_id = run.id
    outcome = runner.run_training(run_id, url=url, settings=settings)
    if outcome != "succeeded":
        raise RuntimeError(f"benchmark training run failed: {outcome}")
    return sorted(set(users))


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> tuple[int, bytes, bytes]:
    """One HTTP/1.1 keep-alive exchange: (status, header block, body)."""
    writer.write(raw)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    body = await reader.readexactly(int(m.group(1))) if m else b""
    return status, head, body


async def _load(port: int, paths: list[tuple[str, dict[str, str]]], clients: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Issue every (path, headers) over ``clients`` keep-alive connections; (client ms, server ms, s).

    A minimal asyncio HTTP/1.1 client keeps the load generator's own CPU use small (the server
    and the generator share the machine's cores).
    """
    lat = np.zeros(len(paths))
    srv = np.full(len(paths), np.nan)
    raws = [_raw(p, h) for p, h in paths]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(len(paths)):
        queue.put_nowait(k)

    async def worker() -> None:
        reader, writer = await _connect(port)
        try:
            while True:
                try:
                    k = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                status, head, body = await _request(reader, writer, raws[k])
                lat[k] = (time.perf_counter() - t0) * 1000
                if status != 200:
                    raise RuntimeError(f"{paths[k][0]} -> {status}: {body[:200]!r}")
                m = _TIMING.search(head.decode("latin-1"))
                if m:
                    srv[k] = float(m.group(1))
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return lat, srv, time.perf_counter() - t0


async def _open_loop(port: int, paths: list[tuple[str, dict[str, str]]], rate: float,
                     warm_connections: int = 64) -> tuple[np.ndarray, float]:
    """Offer ``paths`` at a constant ``rate`` (requests/s) whatever the server does; (ms, seconds).

    Open loop: request k is due at t0 + k/rate and its latency runs from that due time, not from
    when it was sent, so a server that falls behind is charged for the queue it builds (no
    coordinated omission). A due request takes the longest-idle keep-alive connection (first in,
    first out) or opens a new one: every warm connection stays in use, spread over the server's
    worker processes like many clients' connections. (Taking the last one used put the whole
    load on the few connections at the top of a stack, often all on one worker process, while
    the others sat idle until the server closed them after its keep-alive timeout.)
    """
    raws = [_raw(p, h) for p, h in paths]
    idle = collections.deque([await _connect(port) for _ in range(warm_connections)])
    lat = np.full(len(raws), np.nan)
    failures: list[str] = []

    async def one(k: int, due: float) -> None:
        reader, writer = idle.popleft() if idle else await _connect(port)
        try:
            status, _, body = await _request(reader, writer, raws[k])
        except (asyncio.IncompleteReadError, ConnectionError):
            # the server closed this keep-alive connection while it sat idle (uvicorn: after 5 s);
            # like any HTTP client, send the idempotent GET again on a new one (latency still
            # counts from the due time)
            writer.close()
            reader, writer = await _connect(port)
            status, _, body = await _request(reader, writer, raws[k])
        lat[k] = (time.perf_counter() - due) * 1000
        if status != 200:
            failures.append(f"{paths[k][0]} -> {status}: {body[:200]!r}")
        idle.append((reader, writer))

    t0 = time.perf_counter() + 0.05
    tasks = []
    for k in range(len(raws)):
        due = t0 + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(k, due)))
    await asyncio.gather(*tasks)
    seconds = time.perf_counter() - t0
    for _, writer in idle:
        writer.close()
    if failures:
        raise RuntimeError(failures[0])
    return lat, seconds


def _raw(path: str, headers: dict[str, str]) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


def _proc_stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, own + reaped children's user and system CPU seconds), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command name: [1] ppid, [11] utime, [12] stime, [13] cutime, [14] cstime
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    return stats


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants, live or reaped (uvicorn's worker processes
    and anything they spawn). Reaped children count through their parent's cutime/cstime, so the
    total never goes down when a worker exits between two samples."""
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if current in stats:
            total += stats[current][1]
        todo.extend(children.get(current, []))
    return total


def _wait_until_healthy(base: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Block until ``/health`` answers 200; raise (the suite fails) if the server died or never came up."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API server exited with status {proc.returncode} before answering /health "
                               "(set BENCH_SERVE_LOG=path to keep its log)")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the API server did not answer /health within {timeout_s:.0f} s")


@dataclass
class _Measured:
    """One load phase: client latencies (ms), server times (ms), wall seconds, CPU seconds used."""

    lat: np.ndarray
    srv: np.ndarray
    seconds: float
    server_cpu_s: float
    loadgen_cpu_s: float


def _closed_loop(port: int, paths: list[tuple[str, dict[str, str]]]) -> tuple[np.ndarray, np.ndarray, float]:
    """One closed-loop phase: every path over ``CLIENTS`` keep-alive connections."""
    return asyncio.run(_load(port, paths, CLIENTS))


def _with_nan(result: tuple[np.ndarray, float]) -> tuple[np.ndarray, np.ndarray, float]:
    lat, seconds = result
    return lat, np.full(len(lat), np.nan), seconds


def _measure(pid: int, phase: Callable[[], tuple[np.ndarray, np.ndarray, float]]) -> _Measured:
    server0, own0 = _tree_cpu_seconds(pid), time.process_time()
    lat, srv, seconds = phase()
    return _Measured(lat, srv, seconds, _tree_cpu_seconds(pid) - server0, time.process_time() - own0)


def _closed_rows(name: str, m: _Measured) -> list[dict]:
    """Closed loop, 32 clients: requests per second (target 1,000 for recommendations), p50/p99."""
    algorithm = "dpals" if name == "recommend" else "health"
    return [
        make_row(SUITE, "closed-loop-32", algorithm, "requests_per_second", len(m.lat) / m.seconds,
                 baseline=1000.0 if name == "recommend" else None, seconds=m.seconds),
        make_row(SUITE, "closed-loop-32", algorithm, "p50_ms", float(np.percentile(m.lat, 50)), seconds=m.seconds),
        make_row(SUITE, "closed-loop-32", algorithm, "p99_ms", float(np.percentile(m.lat, 99)), seconds=m.seconds),
        make_row(SUITE, "closed-loop-32", algorithm, "server_p50_ms", float(np.nanpercentile(m.srv, 50)),
                 seconds=m.seconds),
        make_row(SUITE, "closed-loop-32", algorithm, "cpu_ms_per_request", 1000 * m.server_cpu_s / len(m.lat),
                 seconds=m.seconds),
    ]


def _open_rows(m: _Measured, rate: float) -> list[dict]:
    """Open loop at ``rate`` offered: p50/p99 from due time (target p99 <= 20 ms), achieved rate."""
    dataset = f"open-loop-{int(rate)}rps"
    return [
        make_row(SUITE, dataset, "dpals", "p50_ms", float(np.percentile(m.lat, 50)), seconds=m.seconds),
        make_row(SUITE, dataset, "dpals", "p99_ms", float(np.percentile(m.lat, 99)), baseline=20.0, seconds=m.seconds),
        make_row(SUITE, dataset, "dpals", "achieved_rps", len(m.lat) / m.seconds, baseline=rate, seconds=m.seconds),
        make_row(SUITE, dataset, "dpals", "cpu_ms_per_request", 1000 * m.server_cpu_s / len(m.lat), seconds=m.seconds),
    ]


def _loadgen_row(phases: list[_Measured]) -> dict:
    """Share of the machine's CPU the load generator itself used over every measured phase."""
    wall = sum(m.seconds for m in phases)
    own = sum(m.loadgen_cpu_s for m in phases)
    return make_row(SUITE, "all-phases", "-", "loadgen_cpu_fraction", own / (wall * (os.cpu_count() or 1)), seconds=wall)


def _redis_url() -> str:
    """The Redis the API processes are configured with (``BENCH_SERVE_REDIS_URL``; db 15 unless
    told otherwise): each person sharing a Redis server picks their own db number."""
    return os.environ.get("BENCH_SERVE_REDIS_URL", "redis://127.0.0.1:6379/15")


def run(quick: bool) -> list[dict]:

    from app.auth import issue_token
    from app.config import Settings
    from benchmarks.ingest import _database

    url, drop = _database()
    secret = "bench-serve-secret-0123456789abcdef-0123"
    n_req = 2_000 if quick else 10_000
    proc = None
    try:
        settings = Settings(database_url=url, redis_url=None, seed_demo=False, embedded_worker=False,
                            secret_key=secret, artifact_dir=Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}")
        users = _prepare(url, quick, settings)
        port = _free_port()
        env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": _redis_url(), "SECRET_KEY": secret,
               "ARTIFACT_DIR": str(settings.artifact_dir), "LOG_LEVEL": "WARNING",
               "SERVER_TIMING": "true",  # opt-in header: the server-side columns read it
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        workers = int(os.environ.get("BENCH_SERVE_WORKERS", str(os.cpu_count() or 1)))  # one per core
        command = [sys.executable, "-m", "app.cli", "api", "--port", str(port), "--workers", str(workers)]
        with open(os.environ.get("BENCH_SERVE_LOG", os.devnull), "wb") as server_log:  # the child keeps its own copy
            proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=server_log)
        base = f"http://127.0.0.1:{port}"
        _wait_until_healthy(base, proc)
        rng = np.random.default_rng(0)
        picks = rng.choice(len(users), size=n_req)
        tokens: dict[str, str] = {}
        reco: list[tuple[str, dict[str, str]]] = []
        for k in picks.tolist():
            u = users[k]
            tok = tokens.setdefault(u, issue_token(u, secret=secret, ttl_seconds=3600))
            reco.append((f"/v1/datasets/default/users/{u}/recommendations?n=20", {"Authorization": f"Bearer {tok}"}))
        health: list[tuple[str, dict[str, str]]] = [("/health", {})] * n_req
        asyncio.run(_load(port, reco[:200], CLIENTS))  # warm-up: model load, connections
        closed = {name: _measure(proc.pid, partial(_closed_loop, port, paths))
                  for name, paths in (("health", health), ("recommend", reco))}
        n_open = int(OPEN_LOOP_RATE * (4 if quick else 15))
        opened = _measure(proc.pid, lambda: _with_nan(asyncio.run(_open_loop(port, reco[:n_open], OPEN_LOOP_RATE))))
        rows: list[dict] = []
        for name, m in closed.items():
            rows += _closed_rows(name, m)
        rows += _open_rows(opened, OPEN_LOOP_RATE)
        rows.append(_loadgen_row([*closed.values(), opened]))
        return rows
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        drop()
