"""`privrec api --workers 2` as real processes: each worker listens on its own SO_REUSEPORT socket,
so a burst of new keep-alive connections reaches both workers; a killed worker is replaced (the
live one serves meanwhile) and the replacement takes connections; SIGTERM stops every worker and
the supervisor exits 0."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from app.db.migrate import upgrade_head
from tests.e2e.conftest import PRIVREC, Proc, base_env, free_port, wait_http

pytestmark = pytest.mark.e2e

SECRET = "api-workers-test-secret-0123456789abcdef"


def _children(pid: int) -> set[int]:
    """The worker processes of supervisor ``pid`` (multiprocessing's spawned children; not its
    resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def _established_inodes(port: int) -> set[str]:
    """Socket inodes of the server side of established TCP connections on local ``port``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            inodes.add(fields[9])
    return inodes


def _connections_per_worker(workers: set[int], port: int) -> dict[int, int]:
    inodes = _established_inodes(port)
    counts = {}
    for pid in workers:
        fds = Path(f"/proc/{pid}/fd")
        links = [os.readlink(fd) for fd in fds.iterdir() if fd.is_symlink()]
        counts[pid] = sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)
    return counts


def _listening(workers: set[int], port: int, timeout: float = 60) -> None:
    """Wait until every worker listens on ``port`` (a socket joins the SO_REUSEPORT group, and
    gets connections, once its worker has started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listening = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
                listening.add(fields[9])
        if all(any(os.readlink(fd)[8:-1] in listening for fd in Path(f"/proc/{pid}/fd").iterdir() if fd.is_symlink())
               for pid in workers):
            return
        time.sleep(0.2)
    pytest.fail(f"workers {workers} did not all listen on {port} within {timeout}s")


def _burst(port: int, n: int = 32) -> list[socket.socket]:
    """``n`` keep-alive connections opened at once, each then answered one `/health`."""
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    for c in conns:
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    for c in conns:
        c.settimeout(30)
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
    return conns


def _wait_workers(pid: int, count: int, exclude: set[int], timeout: float = 60) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = _children(pid) - exclude
        if len(workers) == count:
            return workers
        time.sleep(0.2)
    pytest.fail(f"supervisor {pid} did not have {count} new workers within {timeout}s")


def test_two_workers_share_connections_are_replaced_and_stop_cleanly(spawn, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_head(url)
    port = free_port()
    env = base_env(DATABASE_URL=url, SECRET_KEY=SECRET, SEED_DEMO="false", REDIS_URL="",
                   ARTIFACT_DIR=str(tmp_path / "artifacts"))
    proc: Proc = spawn([PRIVREC, "api", "--port", str(port), "--workers", "2"], env, "api")
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    workers = _wait_workers(proc.p.pid, 2, set())
    _listening(workers, port)
    conns = _burst(port)
    counts = _connections_per_worker(workers, port)
    assert sum(counts.values()) == 32 and min(counts.values()) > 0, counts
    for c in conns:
        c.close()

    killed = min(workers)
    os.kill(killed, signal.SIGKILL)
    replacement = _wait_workers(proc.p.pid, 1, workers)
    for c in _burst(port):  # served by the live worker while the replacement starts
        c.close()
    _listening(replacement, port)
    conns = _burst(port)
    counts = _connections_per_worker(workers - {killed} | replacement, port)
    assert sum(counts.values()) == 32 and min(counts.values()) > 0, counts
    for c in conns:
        c.close()

    os.kill(proc.p.pid, signal.SIGTERM)
    assert proc.p.wait(30) == 0, proc.tail()
    assert not _children(proc.p.pid) and all(not Path(f"/proc/{pid}").exists() for pid in workers | replacement)
    assert "Traceback" not in proc.log.read_text(errors="replace")
