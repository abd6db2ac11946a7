"""Fixtures for the platform tests: migrated SQLite and PostgreSQL databases, Redis, seeding.

PostgreSQL (127.0.0.1:5432, user postgres) and Redis (127.0.0.1:6379) are real services. When
one is unreachable its tests are skipped, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.db.migrate import upgrade_head
from app.db.session import dispose_engines
from tests.integration.platform_helpers import make_settings

PG_ADMIN_DSN = os.environ.get("PRIVREC_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_TEST_URL = os.environ.get("PRIVREC_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} is not reachable ({exc}); start it or run .ci/run"
    if IN_CI:
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


def _pg_admin():
    import psycopg

    return psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=3)


def _pg_url(name: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{name}"


def _drop_pg(conn, name: str) -> None:
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (name,),
    )
    conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database (random name), dropped at the end of the session."""
    try:
        conn = _pg_admin()
    except Exception as exc:  # noqa: BLE001
        _unavailable("PostgreSQL", exc)
    name = f"privrec_tpl_{uuid.uuid4().hex[:12]}"
    conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade_head(_pg_url(name))
        yield name
    finally:
        dispose_engines()
        _drop_pg(conn, name)
        conn.close()


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh migrated PostgreSQL database for one test (random name, dropped afterwards)."""
    name = f"privrec_test_{uuid.uuid4().hex[:12]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    url = _pg_url(name)
    try:
        yield url
    finally:
        dispose_engines()
        with _pg_admin() as conn:
            _drop_pg(conn, name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """A fresh migrated SQLite database file."""
    url = f"sqlite:///{tmp_path / 'privrec.db'}"
    upgrade_head(url)
    yield url
    dispose_engines()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request) -> str:
    """Each test using it runs on SQLite and on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def redis_url() -> str:
    """A Redis database reserved for the tests (flushed before use)."""
    import redis

    try:
        client = redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=3)
        client.ping()
    except Exception as exc:  # noqa: BLE001
        _unavailable("Redis", exc)
    client.flushdb()
    client.close()
    return REDIS_TEST_URL


@pytest.fixture
def settings(tmp_path: Path, db_url: str) -> Settings:
    """Embedded-mode settings pointing at the test database and a temporary artifact dir."""
    return make_settings(tmp_path, db_url)
