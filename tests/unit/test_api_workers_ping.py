"""`privrec api`'s supervisor ping (`app.api_workers.answers_ping`) against real child processes
holding one end of a pipe whose other end, as with uvicorn's workers, the parent keeps too."""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import Connection

import pytest

from app.api_workers import answers_ping


def _worker(conn: Connection, answer: bool) -> None:
    conn.recv()  # the ping
    if not answer:
        os._exit(1)  # dies after the ping was sent, before answering
    conn.send(True)
    time.sleep(600)


class _Process:
    """The two attributes of uvicorn's worker ``Process`` that the ping uses."""

    def __init__(self, answer: bool) -> None:
        self.parent_conn, self.child_conn = multiprocessing.Pipe()  # both ends stay open here
        self.process = multiprocessing.get_context("spawn").Process(target=_worker, args=(self.child_conn, answer))
        self.process.start()


@pytest.mark.timeout(120)
def test_a_worker_that_dies_while_pinged_is_reported_at_once_not_after_the_timeout() -> None:
    worker = _Process(answer=False)
    try:
        assert answers_ping(worker, timeout=3600) is False  # pytest-timeout fails the old behaviour
    finally:
        worker.process.kill()
        worker.process.join()


@pytest.mark.timeout(120)
def test_a_worker_that_answers_is_alive_and_a_dead_one_is_not() -> None:
    worker = _Process(answer=True)
    try:
        assert answers_ping(worker, timeout=60) is True
    finally:
        worker.process.kill()
        worker.process.join()
    assert answers_ping(worker, timeout=60) is False
