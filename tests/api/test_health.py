"""Probes: /health always answers; /ready reports the database and refuses with 503 when down."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from tests.api.conftest import Env, make_settings


def test_health_and_ready(sqlite_env: Env) -> None:
    r = sqlite_env.client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert "server-timing" not in r.headers  # a timing channel: opt-in only
    r = sqlite_env.client.get("/ready")
    assert r.status_code == 200 and r.json() == {"status": "ok", "checks": {"database": "ok"}}


def test_ready_is_503_when_the_database_is_unreachable(tmp_path: Path) -> None:
    settings = make_settings("postgresql+psycopg://postgres@127.0.0.1:9/nowhere?connect_timeout=2", tmp_path)
    app = create_app(settings)
    client = TestClient(app)  # no lifespan: nothing is migrated
    assert client.get("/health").status_code == 200
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["status"] == "unavailable"
    assert r.json()["checks"]["database"].startswith("error")


def test_server_timing_is_opt_in(tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'api.db'}", tmp_path).model_copy(update={"server_timing": True})
    client = TestClient(create_app(settings))
    assert client.get("/health").headers["server-timing"].startswith("app;dur=")


def _production(tmp_path: Path, redis_url: str):
    from app.config import Settings

    return Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", redis_url=redis_url, secret_key="s" * 32,
                    artifact_dir=tmp_path / "artifacts", seed_demo=False, embedded_worker=False)


def test_ready_checks_the_broker_in_production(tmp_path: Path) -> None:
    """Production mode (REDIS_URL set): /ready is 503 while the broker is unreachable."""
    import os

    from app.db.migrate import upgrade_head

    down = _production(tmp_path, "redis://127.0.0.1:9/0")  # a closed port
    upgrade_head(down.database_url)
    r = TestClient(create_app(down)).get("/ready")
    assert r.status_code == 503 and r.json()["checks"]["broker"].startswith("error")
    assert r.json()["checks"]["database"] == "ok"
    up = _production(tmp_path, os.environ.get("PRIVREC_TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
    r = TestClient(create_app(up)).get("/ready")
    if r.json()["checks"]["broker"] != "ok" and os.environ.get("CI") != "true":
        import pytest

        pytest.skip("Redis is not reachable")
    assert r.status_code == 200 and r.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_the_server_factory_freezes_its_start_up_heap(tmp_path: Path, monkeypatch) -> None:
    """``privrec api``'s factory exempts the start-up heap from full GC passes (request pauses)."""
    import gc

    from app.config import get_settings
    from app.main import create_app_from_env

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'api.db'}")
    monkeypatch.setenv("SECRET_KEY", "f" * 32)
    monkeypatch.setenv("REDIS_URL", "")
    get_settings.cache_clear()
    gc.unfreeze()
    try:
        create_app_from_env()
        assert gc.get_freeze_count() > 10_000  # the modules, routes and schemas
    finally:
        gc.unfreeze()
        get_settings.cache_clear()
