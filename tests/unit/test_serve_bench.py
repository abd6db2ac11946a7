"""The serve suite's measuring helpers: process-tree CPU never decreases, a dead server fails fast."""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise

import pytest

from benchmarks.serve import _tree_cpu_seconds, _wait_until_healthy

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"


def test_tree_cpu_counts_descendants_and_survives_their_exit() -> None:
    # a parent that starts a grandchild-free child burning 0.3 s of CPU, waits for it, then idles
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"subprocess.run([sys.executable, '-c', {BURN!r}])\n"
                               "time.sleep(30)\n"])
    try:
        before = _tree_cpu_seconds(parent.pid)
        samples = []
        for _ in range(40):
            samples.append(_tree_cpu_seconds(parent.pid))
            if samples[-1] - before >= 0.3:
                break
            subprocess.run([sys.executable, "-c", "import time; time.sleep(0.1)"], check=True)
        assert all(b >= a for a, b in pairwise(samples)), samples
        assert samples[-1] >= 0.3  # the reaped child's CPU still counts (parent's cutime)
    finally:
        parent.kill()
        parent.wait()


def test_wait_until_healthy_fails_when_the_server_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with status 3"):
        _wait_until_healthy("http://127.0.0.1:9", proc, timeout_s=5)


def test_open_loop_keeps_every_warm_connection_in_use() -> None:
    """The open loop takes the longest-idle connection: at a rate one connection could carry,
    every warm connection still serves requests (so the load spreads over worker processes and no
    connection idles into the server's keep-alive timeout)."""
    import asyncio

    from benchmarks.serve import _open_loop

    served: dict[int, int] = {}

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            key = id(writer)
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    served[key] = served.get(key, 0) + 1
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        await _open_loop(port, [("/x", {})] * 64, rate=400.0, warm_connections=8)
        server.close()

    asyncio.run(main())
    assert len(served) == 8 and min(served.values()) >= 4, served  # last-in-first-out: one or two
