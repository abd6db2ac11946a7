"""No log line names a rater: the logs of succeeding and failing requests (the app's handlers and
access log, and a real ``privrec serve`` process with uvicorn's logging) and of a Celery task
carry no raw id from a path or a body and no task duration; lines name the route template."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from celery import Celery
from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from app.api.deps import get_session
from app.api.observability import JsonFormatter
from app.db.session import normalise_url
from app.logging_setup import TaskLogRedaction
from tests.api.conftest import Env, add_items

RAW_USER, RAW_ITEM = "rawuser-7f3a9", "rawitem-b21c4"
R = "/v1/datasets/default"


def _all_lines(records: list[logging.LogRecord]) -> str:
    """Every server-side record, formatted and raw (the test client's own httpx lines excluded)."""
    formatter = JsonFormatter()
    server = [r for r in records if not r.name.startswith(("httpx", "httpcore"))]
    return "\n".join(formatter.format(r) for r in server) + "\n".join(str(r.__dict__) for r in server)


def test_request_logs_name_templates_never_raw_ids(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    add_items(env, 1)
    caplog.set_level(logging.DEBUG)
    user = env.auth(RAW_USER)
    assert env.client.put(f"{R}/users/{RAW_USER}/ratings/i0", json={"rating": 3}, headers=user).status_code in (200, 201)
    assert env.client.put(f"{R}/users/{RAW_USER}/ratings/{RAW_ITEM}", json={"rating": 3}, headers=user).status_code == 404
    assert env.client.get(f"{R}/users/{RAW_USER}/recommendations", headers=user).status_code in (200, 404)
    assert env.client.post(f"{R}/ratings/batch", headers=env.ingest_service, json={
        "ratings": [{"user_id": RAW_USER, "item_id": RAW_ITEM, "rating": 3}]}).status_code == 422
    assert env.client.delete(f"/v1/users/{RAW_USER}x", headers=env.auth(f"{RAW_USER}x")).status_code in (200, 404)
    _pool_failure(env)
    lines = _all_lines(caplog.records)
    assert "/v1/datasets/{dataset}/users/{user_id}/ratings/{item_id}" in lines
    assert "database pool exhausted" in lines
    assert RAW_USER not in lines and RAW_ITEM not in lines


def _pool_failure(env: Env) -> None:
    """A 503 logged by the error handler on a route whose path names the user (a real pool of
    one connection, held by another thread, through FastAPI's dependency override)."""
    engine = create_engine(normalise_url(env.settings.database_url), pool_size=1, max_overflow=0, pool_timeout=0.2)
    maker = sessionmaker(engine)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            held.set()
            release.wait(30)

    def session():
        s = maker()
        try:
            yield s
        finally:
            s.close()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    app = env.client.app
    app.dependency_overrides[get_session] = session  # type: ignore[attr-defined]
    try:
        r = env.client.get(f"{R}/users/{RAW_USER}/ratings", headers=env.auth(RAW_USER))
        assert r.status_code == 503, r.text
    finally:
        app.dependency_overrides.clear()  # type: ignore[attr-defined]
        release.set()
        holder.join()
        engine.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_privrec_serve_writes_no_raw_path(tmp_path: Path) -> None:
    """The embedded server (uvicorn with the app's logging options): requests that succeed and
    fail leave no raw path in its output."""
    port = _free_port()
    env = {**os.environ, "SECRET_KEY": "x" * 40, "LOG_LEVEL": "INFO"}
    env.pop("REDIS_URL", None)
    out = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--no-demo", "--data-dir", str(tmp_path / "d"),
                             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("privrec serve did not start")
        assert httpx.get(f"{base}{R}/users/{RAW_USER}/recommendations").status_code == 401
        assert httpx.put(f"{base}{R}/users/{RAW_USER}/ratings/{RAW_ITEM}", json={"rating": 3}).status_code == 401
        assert httpx.get(f"{base}/v1/nothing/{RAW_USER}").status_code == 404
    finally:
        proc.terminate()
        proc.wait(30)
        out.close()
    log = (tmp_path / "serve.log").read_text()
    assert "/v1/datasets/{dataset}/users/{user_id}/recommendations" in log
    assert RAW_USER not in log and RAW_ITEM not in log


def test_celery_task_lines_carry_no_duration_or_return_value(caplog: pytest.LogCaptureFixture) -> None:
    """Celery's own tracer (an eager task): "succeeded in Xs: <value>" becomes "succeeded"; a
    failure names the exception's type, not its message. Importing the worker app installs it."""
    import workers.celery_app  # noqa: F401 - installs the filter, as the worker process does

    trace_logger = logging.getLogger("celery.app.trace")
    assert any(isinstance(f, TaskLogRedaction) for f in trace_logger.filters)
    app = Celery("log-privacy-test", broker="memory://")

    @app.task(name="t.ok")
    def ok(user: str) -> str:
        return f"trained for {user}"

    @app.task(name="t.fail")
    def fail(user: str) -> None:
        raise ValueError(f"bad rows of {user}")

    caplog.set_level(logging.INFO, logger="celery.app.trace")
    ok.apply(args=(RAW_USER,))
    fail.apply(args=(RAW_USER,))
    lines = "\n".join(r.getMessage() for r in caplog.records if r.name == "celery.app.trace")
    assert "t.ok" in lines and "succeeded" in lines and "succeeded in" not in lines
    assert "t.fail" in lines and "ValueError" in lines
    assert RAW_USER not in lines
