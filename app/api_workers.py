"""``privrec api --workers N``: N uvicorn worker processes, each on its own listening socket.

uvicorn's multi-process mode shares one listening socket between its workers, and an event loop
accepts every pending connection when it wakes, so one worker can take most of a burst of new
keep-alive connections (a closed-loop run saw 20 sockets in one worker and 51 in the other) and
the other sits half idle. Here every worker gets its own socket bound with ``SO_REUSEPORT``, and
the kernel spreads new connections over the sockets by a hash of their addresses.

A socket joins the kernel's group when its worker starts listening, so connections go only to
workers that have started. The supervisor replaces a worker that exits or stops answering
uvicorn's health ping on a fresh socket (the dead worker's socket is closed: new connections go
to the live workers while the replacement starts, instead of waiting in a queue nobody
accepts), stops for good if a worker fails before it ever started (a broken app or
configuration would fail the same way again), and on SIGINT/SIGTERM asks every worker to finish
its requests and waits.
"""

from __future__ import annotations

import logging
import pickle
import signal
import socket
import threading
import time
from types import FrameType

from uvicorn import Config
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Process

__all__ = ["Supervisor", "answers_ping", "tcp_listener", "reuse_port_listeners"]

log = logging.getLogger("uvicorn.error")
POLL_S = 0.5


def tcp_listener(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound listening socket created with ``IPPROTO_TCP``, inheritable by worker processes.

    uvicorn's own multi-process socket has protocol 0, so asyncio does not switch Nagle off on
    accepted connections and every response waits ~40 ms for a delayed ACK; with the protocol
    set, connections get TCP_NODELAY as in the single-process server.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def reuse_port_listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets on one address (``SO_REUSEPORT``), one per worker process.

    The port is first bound without ``SO_REUSEPORT``: that fails if any server listens there
    already (another ``privrec api`` of the same user would otherwise join the group silently and
    take a share of the connections); port 0 picks a free port the same way.
    """
    with tcp_listener(host, port) as probe:
        port = probe.getsockname()[1]
    return [tcp_listener(host, port, reuse_port=True) for _ in range(count)]


class Supervisor:
    """One uvicorn worker process per socket, kept alive until SIGINT or SIGTERM."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self.processes: list[Process] = []
        self.should_exit = threading.Event()

    def run(self) -> int:
        """Start the workers, keep them alive, stop them all on a signal; the exit status."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.processes = [self._start(sock) for sock in self.sockets]
        status = 0
        while not self.should_exit.wait(POLL_S):
            status = self._replace_dead()
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.join()
        for sock in self.sockets:
            sock.close()
        return status

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        log.info("Received %s, stopping the workers.", signal.Signals(sig).name)
        self.should_exit.set()

    def _start(self, sock: socket.socket) -> Process:
        process = Process(self.config, [sock])
        process.start()
        return process

    def _replace_dead(self) -> int:
        """Replace every worker that has exited or does not answer its ping; 1 (and stop) if one
        failed at start-up, else 0."""
        for idx, process in enumerate(self.processes):
            if self.should_exit.is_set() or answers_ping(process, self.config.timeout_worker_healthcheck):
                continue
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                log.error("Worker [%s] failed to start, stopping.", process.pid)
                self.should_exit.set()
                return 1
            log.warning("Worker [%s] died (exit code %s), starting another.", process.pid, process.exitcode)
            self.sockets[idx] = _fresh(self.sockets[idx])
            self.processes[idx] = self._start(self.sockets[idx])
        return 0


def answers_ping(process: Process, timeout: float) -> bool:
    """Whether ``process`` is running and answers uvicorn's health ping within ``timeout``, given
    up as soon as it exits. uvicorn's own ``is_alive`` waits the whole timeout (60 s here) for a
    worker that dies after the ping was sent: the supervisor holds both ends of the pipe, so a
    dead worker's end never reads as closed, and its replacement waited that long."""
    if not process.process.is_alive():
        return False
    try:
        process.parent_conn.send(b"ping")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.parent_conn.poll(PING_SLICE_S):
                process.parent_conn.recv()
                return True
            if not process.process.is_alive():
                return False
    except (OSError, EOFError, pickle.UnpicklingError):
        return False
    return False


PING_SLICE_S = 0.1


def _fresh(sock: socket.socket) -> socket.socket:
    """A new ``SO_REUSEPORT`` socket on ``sock``'s address, which is closed."""
    host, port = sock.getsockname()[:2]
    sock.close()
    return tcp_listener(host, port, reuse_port=True)
