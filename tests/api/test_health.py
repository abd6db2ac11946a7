"""Probes: /health always answers; /ready reports the database and refuses with 503 when down."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from tests.api.conftest import Env, make_settings


def test_health_and_ready(sqlite_env: Env) -> None:
    r = sqlite_env.client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.headers["server-timing"].startswith("app;dur=")
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
