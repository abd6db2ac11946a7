"""The log format in one process: JSON lines with UTC timestamps (under a local time zone 5:30
ahead of UTC), exceptions named by type only, only the allowed extras, and the request id bound
in a request carried by a Celery task's headers into its lines (Celery's in-process path; the
real processes are tests/integration/test_log_format.py)."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from app.logging_setup import REQUEST_ID, current_request_id, request_id_headers, service_handler

RAW = "rawuser-5d1e0"


@pytest.fixture
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time 5:30 ahead of UTC (POSIX TZ string, no tz database needed)."""
    monkeypatch.setenv("TZ", "PRV-05:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The service's handler on the loggers these tests write to, into a buffer."""
    out = io.StringIO()
    handler = service_handler("json", out)
    loggers = [logging.getLogger(name) for name in ("privrec.test", "celery.app.trace")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    yield out
    for logger in loggers:
        logger.removeHandler(handler)


def _lines(out: io.StringIO) -> list[dict]:
    return [json.loads(raw) for raw in out.getvalue().splitlines() if raw.strip()]


def test_timestamps_are_utc_whatever_the_local_zone(local_zone: None, captured: io.StringIO) -> None:
    assert time.localtime().tm_gmtoff == 5 * 3600 + 1800
    logging.getLogger("privrec.test").info("hello")
    (line,) = _lines(captured)
    assert line["ts"].endswith("Z") and line["level"] == "info" and line["logger"] == "privrec.test"
    stamped = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert abs(stamped - datetime.now(UTC)) < timedelta(minutes=5)  # local time would be 5:30 off


def test_exceptions_by_type_and_only_allowed_extras(captured: io.StringIO) -> None:
    log = logging.getLogger("privrec.test")
    try:
        raise ValueError(f"bad row of {RAW}")
    except ValueError:
        log.exception("ingest failed")
    log.info("request", extra={"http": {"route": "/v1/x/{user_id}"}, "data": {"user": RAW}})
    failed, access = _lines(captured)
    assert failed["exc_type"] == "ValueError" and failed["msg"] == "ingest failed"
    assert access["http"] == {"route": "/v1/x/{user_id}"} and "data" not in access
    assert RAW not in captured.getvalue()


def test_a_task_carries_the_request_id_of_the_request_that_sent_it(captured: io.StringIO) -> None:
    import workers.celery_app  # noqa: F401 - connects the signals that bind the id, as the worker does

    app = Celery("log-format-test", broker="memory://")

    @app.task(name="t.train")
    def train() -> None:
        logging.getLogger("privrec.test").info("training")

    assert request_id_headers() == {}
    token = REQUEST_ID.set("req-42")
    try:
        headers = request_id_headers()
    finally:
        REQUEST_ID.reset(token)
    train.apply(headers=headers)
    assert current_request_id() is None  # unbound once the task ended
    train.apply()
    lines = _lines(captured)
    with_id = [line for line in lines if line.get("request_id") == "req-42"]
    assert [line["msg"] for line in with_id][0] == "training"
    assert any(line["msg"].startswith("Task t.train[") for line in with_id)
    assert len(with_id) == 2 and len(lines) == 4 and "request_id" not in lines[-1]


def test_the_pools_own_lines_go_through_the_services_handler() -> None:
    """billiard's pool logger does not propagate by default: its lines (a pool child killed by a stop
    signal) would reach stderr as plain text through logging's last resort."""
    import billiard.util  # noqa: PLC0415 - Celery's pool library, imported where the worker's set-up is tested

    from workers.celery_app import pool_logs_in_service_format  # noqa: PLC0415

    root = logging.getLogger()
    out = io.StringIO()
    handler = service_handler("json", out)
    root.addHandler(handler)
    try:
        pool_logs_in_service_format()
        billiard.util.error("Process %r pid:%r exited with %r", "ForkPoolWorker-1", 7725, "signal 15 (SIGTERM)")
    finally:
        root.removeHandler(handler)
    (line,) = [json.loads(raw) for raw in out.getvalue().splitlines()]
    assert line["level"] == "error" and line["logger"] == "multiprocessing" and "ForkPoolWorker-1" in line["msg"]
