"""API test fixtures: a migrated database (SQLite always; PostgreSQL marked ``integration``),
the app on it via TestClient, token helpers and a published model."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from app.auth import issue_token
from app.config import Settings
from app.db.migrate import upgrade_head
from app.db.session import dispose_engines, get_sessionmaker
from app.main import create_app

PG_ADMIN_URL = os.environ.get("PRIVREC_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SECRET = "api-tests-secret-0123456789abcdef"


def _pg_available() -> bool:
    try:
        eng = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with eng.connect() as conn:
            conn.execute(text("SELECT 1"))
        eng.dispose()
        return True
    except Exception:  # noqa: BLE001
        return False


def require_postgres() -> None:
    """Skip (or, under CI=true, fail) when PostgreSQL is unreachable."""
    if not _pg_available():
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL is not reachable at 127.0.0.1:5432 under CI=true")
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")


def create_pg_database() -> tuple[str, Callable[[], None]]:
    """A fresh PostgreSQL database; returns (url, drop)."""
    name = f"privrec_api_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name

    def drop() -> None:
        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


@dataclass
class Env:
    """One app on one migrated database."""

    settings: Settings
    client: TestClient

    def session(self) -> Session:
        return get_sessionmaker(self.settings.database_url)()

    def token(self, subject: str, kind: str = "user", scopes: tuple[str, ...] = (), ttl: int = 600) -> str:
        return issue_token(subject, secret=SECRET, kind=kind, scopes=scopes, ttl_seconds=ttl)

    def auth(self, subject: str, kind: str = "user", scopes: tuple[str, ...] = ()) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(subject, kind, scopes)}"}

    @property
    def admin(self) -> dict[str, str]:
        return self.auth("root", "admin")

    @property
    def ingest_service(self) -> dict[str, str]:
        return self.auth("frontend", "service", ("ingest", "act_for_users"))

    def count(self, table: str) -> int:
        with self.session() as s:
            return int(s.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def make_settings(database_url: str, tmp: Path) -> Settings:
    return Settings(database_url=database_url, redis_url=None, secret_key=SECRET,
                    artifact_dir=tmp / "artifacts", seed_demo=False, embedded_worker=False)


def _bootstrap(settings: Settings) -> None:
    from app.services import budget

    upgrade_head(settings.database_url)
    with get_sessionmaker(settings.database_url)() as s:
        budget.bootstrap(s, settings)
        s.commit()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """The app on SQLite and (integration) on PostgreSQL."""
    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'api.db'}"
    else:
        require_postgres()
        url, drop = create_pg_database()
    settings = make_settings(url, tmp_path)
    _bootstrap(settings)
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            yield Env(settings=settings, client=client)
    finally:
        dispose_engines()
        if drop is not None:
            drop()


@pytest.fixture
def sqlite_env(tmp_path: Path) -> Iterator[Env]:
    """SQLite only (tests whose behaviour does not depend on the database)."""
    settings = make_settings(f"sqlite:///{tmp_path / 'api.db'}", tmp_path)
    _bootstrap(settings)
    with TestClient(create_app(settings)) as client:
        yield Env(settings=settings, client=client)
    dispose_engines()


def create_votes_dataset(env: Env, name: str = "votes", *, cap: float = 10.0, delta: float = 1e-6) -> None:
    """A data set for randomised-response votes: it declares `replace_vote_values` (what randomised
    response protects) and counts against a per-person budget of that relation, both named ``name``."""
    r = env.client.put(f"/v1/admin/person-budgets/{name}", headers=env.admin,
                       json={"epsilon_cap": cap, "delta": delta, "neighbouring_relation": "replace_vote_values"})
    assert r.status_code == 200, r.text
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={
        "name": name, "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": cap, "delta": delta,
        "neighbouring_relation": "replace_vote_values", "person_budget": name})
    assert r.status_code == 201, r.text


def add_items(env: Env, n: int, dataset: str = "default", categories: Callable[[int], list[str]] | None = None) -> None:
    for k in range(n):
        cats = categories(k) if categories else ["even" if k % 2 == 0 else "odd"]
        r = env.client.put(f"/v1/datasets/{dataset}/items/i{k}", headers=env.ingest_service,
                           json={"title": f"Item {k}", "categories": cats})
        assert r.status_code in (200, 201), r.text  # 201: created


SMALL_DPALS = {"rank": 4, "frequent_fraction": 1.0, "contribution_bound": 30, "reg_item": 5.0}


def seed_ratings(env: Env, n_users: int = 60, n_items: int = 24, seed: int = 0, dataset: str = "default") -> None:
    """Two taste groups: even users like even items, odd users like odd items."""
    import numpy as np

    add_items(env, n_items, dataset=dataset)
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        for i in rng.choice(n_items, size=12, replace=False):
            liked = (u % 2) == (i % 2)
            rows.append({"user_id": f"u{u}", "item_id": f"i{i}", "rating": 5.0 if liked else 1.0})
    r = env.client.post(f"/v1/datasets/{dataset}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 200, r.text


def train_and_publish(env: Env, epsilon: float = 2.0, dataset: str = "default",
                      hyper: dict | None = None) -> int:
    """Start a run through the admin API and execute it in this process; return the version id."""
    from app.services.training.runner import run_training

    r = env.client.post(f"/v1/admin/datasets/{dataset}/trainings", headers=env.admin,  # a new run each call:
                        json={"epsilon": epsilon, "hyperparameters": hyper or SMALL_DPALS,  # its own key
                              "idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    assert run_training(run_id, url=env.settings.database_url, settings=env.settings) == "succeeded"
    status = env.client.get(f"/v1/admin/trainings/{run_id}", headers=env.admin).json()
    assert status["status"] == "succeeded" and status["progress"] == 1.0
    return int(env.client.get(f"/v1/datasets/{dataset}/model").json()["model_version"])
