"""Serving latency and throughput over real HTTP, next to /health in the same run.

Set-up: PostgreSQL data set with 20,000 items and production-shaped synthetic ratings; one real
DPALS run (rank 64) through the training service publishes the model; then ``privrec api``
(uvicorn, one process) serves it. The load generator (this process) runs 32 concurrent
keep-alive clients, each request for a random user with that user's own token.

Rows: ``*_latency_p50_ms``/``*_latency_p99_ms`` observed by the clients under 32-way load,
``*_server_p50_ms``/``*_server_p99_ms`` (time inside the app, from the ``Server-Timing``
header), ``*_throughput_rps``, and single-client latency ``*_latency_1client_p50_ms``/``p99``.
Targets on the 2-core machine: recommendation p99 <= 20 ms and >= 500 requests/s.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import make_row

SUITE = "serve"
N_ITEMS = 20_000
RANK = 64
CLIENTS = 32
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
    from app.services import budget, ingest, training

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
        ingest.import_items(s, dataset="default", rows=[(f"item-{i}", f"item-{i}", []) for i in range(N_ITEMS)])
        s.commit()
    for k in range(0, len(users), 50_000):
        with maker() as s:
            ingest.import_ratings(s, dataset="default", rows=list(zip(users[k:k + 50_000], items[k:k + 50_000],
                                                                      values[k:k + 50_000])))
            s.commit()
    hyper = {"rank": RANK, "n_steps": 1, "frequent_fraction": 0.25 if quick else 0.4}
    with maker() as s:
        run = training.start_training(s, dataset="default", epsilon=2.0, hyperparameters=hyper, actor="bench")
        s.commit()
        run_id = run.id
    outcome = training.run_training(run_id, url=url, settings=settings)
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
    raws = [
        (f"GET {p} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode()
        for p, h in paths
    ]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(len(paths)):
        queue.put_nowait(k)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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


def _rows(name: str, lat: np.ndarray, srv: np.ndarray, seconds: float, lat1: np.ndarray, label: str) -> list[dict]:
    out = []
    for metric, value, base in (
        (f"{name}_latency_p50_ms", np.percentile(lat, 50), None),
        (f"{name}_latency_p99_ms", np.percentile(lat, 99), 20.0 if name == "recommend" else None),
        (f"{name}_server_p50_ms", np.nanpercentile(srv, 50), None),
        (f"{name}_server_p99_ms", np.nanpercentile(srv, 99), 20.0 if name == "recommend" else None),
        (f"{name}_throughput_rps", len(lat) / seconds, 500.0 if name == "recommend" else None),
        (f"{name}_latency_1client_p50_ms", np.percentile(lat1, 50), None),
        (f"{name}_latency_1client_p99_ms", np.percentile(lat1, 99), 20.0 if name == "recommend" else None),
    ):
        out.append(make_row(SUITE, label, "dpals" if name == "recommend" else "-", metric, float(value),
                            baseline=base, seconds=seconds))
    return out


def run(quick: bool) -> list[dict]:
    import httpx

    from app.auth import issue_token
    from app.config import Settings
    from benchmarks.ingest import _database

    url, drop = _database()
    secret = "bench-serve-secret-0123456789abcdef-0123"
    n_req = 2_000 if quick else 10_000
    label = f"synthetic-{N_ITEMS}i-r{RANK}"
    proc = None
    try:
        settings = Settings(database_url=url, redis_url=None, seed_demo=False, embedded_worker=False,
                            secret_key=secret, artifact_dir=Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}")
        users = _prepare(url, quick, settings)
        port = _free_port()
        env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": "redis://127.0.0.1:6379/15", "SECRET_KEY": secret,
               "ARTIFACT_DIR": str(settings.artifact_dir), "LOG_LEVEL": "WARNING",
               "SERVER_TIMING": "true",  # opt-in header: the server-side columns read it
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        workers = int(os.environ.get("BENCH_SERVE_WORKERS", "1"))
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "api", "--port", str(port), "--workers", str(workers)], env=env,
                                stdout=subprocess.DEVNULL, stderr=open(os.environ.get("BENCH_SERVE_LOG", os.devnull), "wb"))
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        rng = np.random.default_rng(0)
        picks = rng.choice(len(users), size=n_req)
        tokens = {}
        reco = []
        for k in picks.tolist():
            u = users[k]
            tok = tokens.setdefault(u, issue_token(u, secret=secret, ttl_seconds=3600))
            reco.append((f"/v1/datasets/default/users/{u}/recommendations?n=20", {"Authorization": f"Bearer {tok}"}))
        health = [("/health", {})] * n_req
        asyncio.run(_load(port, reco[:200], CLIENTS))  # warm-up: model load, connections
        rows: list[dict] = []
        for name, paths in (("health", health), ("recommend", reco)):
            lat, srv, seconds = asyncio.run(_load(port, paths, CLIENTS))
            lat1, _, _ = asyncio.run(_load(port, paths[: max(200, n_req // 10)], 1))
            rows += _rows(name, lat, srv, seconds, lat1, label)
        return rows
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        drop()
