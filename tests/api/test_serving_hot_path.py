"""The serving hot path on PostgreSQL: one read on the event loop, then the process's caches.

Warm caches answer without a worker thread and give exactly the full path's answer; whatever the
caches cannot answer (catalogue due for a reload, long histories) takes the full path; a database
that is down is still a clear 503.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.routes import recommendations as reco_routes
from app.db.session import dispose_engines
from app.main import create_app
from app.services.serving import active, recommend
from tests.api.conftest import (
    Env,
    _bootstrap,
    add_items,
    create_pg_database,
    make_settings,
    require_postgres,
    seed_ratings,
    train_and_publish,
)

pytestmark = pytest.mark.integration

R = "/v1/datasets/default"


@pytest.fixture
def pg_published(tmp_path: Path) -> Iterator[Env]:
    """A trained, published model on PostgreSQL, served by an app whose lifespan has run."""
    require_postgres()
    url, drop = create_pg_database()
    settings = make_settings(url, tmp_path)
    _bootstrap(settings)
    try:
        with TestClient(create_app(settings)) as client:
            env = Env(settings=settings, client=client)
            seed_ratings(env)
            train_and_publish(env)
            yield env
    finally:
        dispose_engines()
        drop()


def _requests(env: Env) -> list[dict]:
    """A GET, a filtered POST, a ranking and a new user's fallback: each response's JSON."""
    get = env.client.get(f"{R}/users/u0/recommendations", params={"n": 6}, headers=env.auth("u0"))
    post = env.client.post(f"{R}/users/u1/recommendations", headers=env.auth("u1"),
                           json={"n": 4, "categories": ["odd", "none-such"], "exclude": ["i1", "i3"]})
    ranked = env.client.post(f"{R}/users/u2/recommendations", headers=env.auth("u2"), json={"items": ["i4", "i5", "i6"]})
    fresh = env.client.get(f"{R}/users/nobody/recommendations", headers=env.auth("nobody"))
    for r in (get, post, ranked, fresh):
        assert r.status_code == 200, r.text
    return [r.json() for r in (get, post, ranked, fresh)]


class _ThreadSpy:
    """Counts the requests that took the threaded full path (and still runs it)."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = reco_routes.run_with_session

    async def __call__(self, request, work):
        self.calls += 1
        return await self.real(request, work)


def test_warm_caches_answer_without_a_worker_thread_and_agree_with_the_full_path(
        pg_published: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env = pg_published
    assert env.client.app.state.read_pool is not None  # type: ignore[attr-defined]  # opened by the lifespan
    monkeypatch.setattr(active, "CATALOG_TTL_S", 3600.0)  # no reload due while the test runs
    spy = _ThreadSpy()
    monkeypatch.setattr(reco_routes, "run_with_session", spy)
    _requests(env)  # warms the model and catalogue caches (full path where cold)
    spy.calls = 0
    warm = _requests(env)
    assert spy.calls == 0  # every one answered on the event loop
    monkeypatch.setattr(recommend, "recommend_cached", lambda *a, **k: None)  # force the full path
    assert _requests(env) == warm
    assert spy.calls == 4
    assert warm[1]["notes"] == ["no item carries category 'none-such'"]
    assert warm[3]["fallback"] is True


def test_a_write_is_seen_by_the_next_warm_request(pg_published: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env = pg_published
    monkeypatch.setattr(active, "CATALOG_TTL_S", 3600.0)
    spy = _ThreadSpy()
    monkeypatch.setattr(reco_routes, "run_with_session", spy)
    before = _requests(env)[0]
    top = before["items"][0]["item_id"]
    spy.calls = 0
    r = env.client.put(f"{R}/users/u0/ratings/{top}", json={"rating": 1.0}, headers=env.auth("u0"))
    assert r.status_code in (200, 201), r.text
    add_items(env, 1)  # an item write: this process forgets its catalogue
    after = env.client.get(f"{R}/users/u0/recommendations", params={"n": 6}, headers=env.auth("u0")).json()
    assert top not in {x["item_id"] for x in after["items"]}
    assert spy.calls == 1  # the catalogue reload took the full path once
    again = env.client.get(f"{R}/users/u0/recommendations", params={"n": 6}, headers=env.auth("u0")).json()
    assert again == after and spy.calls == 1


def test_what_the_caches_cannot_answer_takes_the_full_path(pg_published: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """... from the rows already read: still one round trip for the user's ratings."""
    env = pg_published
    spy = _ThreadSpy()
    monkeypatch.setattr(reco_routes, "run_with_session", spy)
    warm = _requests(env)
    reads: list[object] = []
    real_read = active.read_rows
    monkeypatch.setattr(active, "read_rows", lambda *a: reads.append(a) or real_read(*a))
    monkeypatch.setattr(active, "CATALOG_TTL_S", 0.0)  # the catalogue is always due for a reload
    spy.calls = 0
    assert _requests(env) == warm and spy.calls == 3  # a ranking of given items reads no catalogue
    monkeypatch.setattr(active, "CATALOG_TTL_S", 3600.0)
    monkeypatch.setattr(recommend, "INLINE_MAX_RATINGS", 1)  # every history counts as long
    spy.calls = 0
    assert _requests(env) == warm and spy.calls == 3  # the new user has no ratings: one row
    assert reads == []  # the threaded path worked from the rows the event loop had read


def test_recommendations_with_the_database_down_are_503(tmp_path: Path) -> None:
    require_postgres()  # the driver and pool are exercised, not the server
    settings = make_settings("postgresql+psycopg://postgres@127.0.0.1:1/none", tmp_path).model_copy(
        update={"redis_url": os.environ.get("PRIVREC_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")})
    env = Env(settings=settings, client=None)  # type: ignore[arg-type]  # for its tokens only
    try:
        with TestClient(create_app(settings)) as client:
            assert client.app.state.read_pool is not None  # type: ignore[attr-defined]
            r = client.get(f"{R}/users/u0/recommendations", headers=env.auth("u0"))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
            assert "127.0.0.1" not in r.text
    finally:
        dispose_engines()
