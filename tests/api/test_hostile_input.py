"""Hostile input, on SQLite and PostgreSQL: every case is a clear 4xx that writes nothing, never a
5xx; error bodies are bounded and never echo the input; oversized shapes are refused before
validation; an exhausted connection pool is a 503 with Retry-After."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from app.api.deps import get_session
from app.api.errors import MAX_REPORTED_ERRORS
from app.db.session import normalise_url
from tests.api.conftest import Env, add_items

R = "/v1/datasets/default"
A = "/v1/admin/datasets/default"


def _post_raw(env: Env, path: str, body: str, headers: dict[str, str]):
    return env.client.post(path, content=body.encode("utf-8", "surrogatepass"),
                           headers={**headers, "Content-Type": "application/json"})


# ----------------------------------------------------------------------------- one id rule
@pytest.mark.parametrize("bad_id", ["a\nb", "a" * 128 + "\n" + "a" * 128, "a" * 129, "a\x00b", "tab\there", "é"])
def test_the_batch_fast_path_refuses_every_id_the_single_route_refuses(env: Env, bad_id: str) -> None:
    add_items(env, 2)
    rows = [{"user_id": "u1", "item_id": "i0", "rating": 3.0}, {"user_id": bad_id, "item_id": "i1", "rating": 4.0}]
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 422, r.text
    assert env.count("ratings") == 0


def test_a_lone_surrogate_in_a_batch_id_is_422_not_500(env: Env) -> None:
    add_items(env, 1)
    body = '{"ratings": [{"user_id": "u\\ud800", "item_id": "i0", "rating": 3}]}'
    r = _post_raw(env, f"{R}/ratings/batch", body, env.ingest_service)
    assert r.status_code == 422, r.text
    assert "ud800" not in r.text and env.count("ratings") == 0


@pytest.mark.parametrize("value", [-1, 2**63, 10**18 + 1])
def test_integer_ids_outside_the_documented_range_are_refused(env: Env, value: int) -> None:
    add_items(env, 1)
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": [{"user_id": value, "item_id": "i0", "rating": 3}]},
                        headers=env.ingest_service)
    assert r.status_code == 422, r.text
    assert env.count("ratings") == 0


# ----------------------------------------------------------------------------- text, integers, ranges
def test_nul_in_text_fields_is_422_and_writes_nothing(env: Env) -> None:
    r = env.client.put(f"{R}/items/i0", json={"title": "a\x00b"}, headers=env.ingest_service)
    assert r.status_code == 422, r.text
    assert env.count("items") == 0
    r = env.client.put(f"{R}/items/i0", content=b'{"title": "a\\ud800b"}',
                       headers={**env.ingest_service, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text  # a lone surrogate: not valid Unicode, refused like NUL
    assert env.count("items") == 0
    r = env.client.patch(f"{A}/budget", headers=env.admin, json={"epsilon_cap": 50.0, "reason": "more\x00"})
    assert r.status_code == 422, r.text
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={
        "name": "nul", "description": "x\x00", "rating_min": 1, "rating_max": 5, "epsilon_cap": 1, "delta": 1e-6})
    assert r.status_code == 422, r.text
    r = env.client.put(f"{A}/similarity-sources/s1", headers=env.admin,
                       json={"provenance": "https://x\x00", "declared_public": True})
    assert r.status_code == 422, r.text
    before = env.count("ledger_entries")
    r = env.client.post(f"{A}/trainings", headers=env.admin, json={"epsilon": 1.0, "idempotency_key": "k\x00"})
    assert r.status_code == 422, r.text
    assert env.count("ledger_entries") == before and env.count("training_runs") == 0
    assert env.count("similarity_sources") == 0


@pytest.mark.parametrize("patch", [{"max_users": 2**31}, {"max_users": 10**12}])
def test_integers_are_bounded_by_their_column(env: Env, patch: dict) -> None:
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={
        "name": "big", "rating_min": 1, "rating_max": 5, "epsilon_cap": 1, "delta": 1e-6, **patch})
    assert r.status_code == 422, r.text
    r = env.client.patch(f"{A.rsplit('/', 1)[0]}/default", headers=env.admin, json=patch)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("low,high", [(-1.7e308, 1.7e308), (1.0, 1e7), (-1e7, 0.0)])
def test_rating_ranges_are_finite_and_sane(env: Env, low: float, high: float) -> None:
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={
        "name": "wide", "rating_min": low, "rating_max": high, "epsilon_cap": 1, "delta": 1e-6})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("item", [
    {"categories": ["c" * 129]},
    {"categories": ["ok", ""]},
    {"features": {"k" * 129: 1}},
    {"features": {"tag": "v" * 1025}},
    {"features": {"tags": ["t"] * 65}},
    {"features": {"t": "a\x00"}},
])
def test_item_feature_and_category_lengths_are_bounded(env: Env, item: dict) -> None:
    r = env.client.put(f"{R}/items/i0", json=item, headers=env.ingest_service)
    assert r.status_code == 422, r.text
    assert env.count("items") == 0


# ----------------------------------------------------------------------------- bounded error bodies
def test_a_batch_of_bad_rows_gets_a_bounded_error_that_echoes_nothing(env: Env) -> None:
    add_items(env, 1)
    secret = "S3CRET-VALUE"
    rows = [{"user_id": f"u{k}", "item_id": "i0", "rating": secret} for k in range(10_000)]
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 422, r.text[:500]
    error = r.json()["error"]
    assert len(error["details"]) == MAX_REPORTED_ERRORS
    assert "10000 errors" in error["message"] and "nothing was written" in error["message"]
    assert secret not in r.text and all("input" not in d for d in error["details"])
    assert len(r.content) < 10_000
    assert env.count("ratings") == 0


def test_unknown_keys_are_reported_cut_short_and_never_in_full(env: Env) -> None:
    long_key = "k" * 10_000
    r = env.client.post(f"{A}/trainings", headers=env.admin, json={"epsilon": 1.0, long_key: 1})
    assert r.status_code == 422
    assert long_key not in r.text and len(r.content) < 2_000


# ----------------------------------------------------------------------------- shapes before validation
def test_100000_bad_rows_are_refused_by_their_count(env: Env) -> None:
    rows = [{"user_id": "u", "item_id": "i", "rating": "bad"}] * 100_000
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 413 and r.json()["error"]["code"] == "batch_too_large"
    assert r.json()["error"]["details"] == {"max_rows": 10_000, "rows": 100_000}


@pytest.mark.parametrize("body", [
    {"epsilon": 1.0, **{f"k{i}": 0 for i in range(5_000)}},  # keys in one object
    {"epsilon": 1.0, "hyperparameters": {"x": json.loads("[" * 50 + "]" * 50), "pad": "p" * 20_000}},  # depth
    {"epsilon": 1.0, "hyperparameters": {"x": [0] * 10_000}},  # elements of one array
])
def test_bodies_past_a_routes_shape_limits_are_413_before_validation(env: Env, body: dict) -> None:
    r = env.client.post(f"{A}/trainings", headers=env.admin, json=body)
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"]["code"] == "body_too_large"
    assert env.count("training_runs") == 0


def test_a_full_valid_batch_passes_the_shape_check(sqlite_env: Env) -> None:
    add_items(sqlite_env, 1)
    rows = [{"user_id": f"u{k}", "item_id": "i0", "rating": 3.0} for k in range(10_000)]
    r = sqlite_env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=sqlite_env.ingest_service)
    assert r.status_code == 200, r.text[:300]
    assert sqlite_env.count("ratings") == 10_000


# ----------------------------------------------------------------------------- pool exhausted
@pytest.fixture
def one_connection_pool(env: Env) -> Iterator[tuple[Env, threading.Event]]:
    """The app's sessions drawn from a real pool of one connection with a 0.2 s timeout, the
    connection held by another thread until the event is set (FastAPI's dependency override)."""
    engine = create_engine(normalise_url(env.settings.database_url), pool_size=1, max_overflow=0, pool_timeout=0.2)
    maker = sessionmaker(engine)
    release, held = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)

    def session():
        s = maker()
        try:
            yield s
        finally:
            s.close()

    app = env.client.app
    app.dependency_overrides[get_session] = session  # type: ignore[attr-defined]
    try:
        yield env, release
    finally:
        app.dependency_overrides.clear()  # type: ignore[attr-defined]
        release.set()
        holder.join()
        engine.dispose()


def test_an_exhausted_pool_is_503_with_retry_after(one_connection_pool) -> None:
    env, _ = one_connection_pool
    r = env.client.get(f"{A}/budget", headers=env.admin)
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"].isdigit()
    assert r.json()["error"]["code"] == "database_unavailable"


def test_a_training_body_past_its_route_limit_is_413_before_it_is_read(env: Env) -> None:
    r = env.client.post(f"{A}/trainings", headers=env.admin,
                        json={"epsilon": 1.0, "hyperparameters": {"pad": "p" * 70_000}})
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"]["code"] == "body_too_large"
    assert r.json()["error"]["details"] == {"max_bytes": 64 * 1024}
    assert env.count("training_runs") == 0


def test_a_large_batch_of_bad_votes_gets_the_bounded_422_from_the_worker_thread(env: Env) -> None:
    rows = [{"user_id": f"u{k}", "item_id": "i0", "vote": 0} for k in range(2_000)]
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service)
    assert r.status_code == 422, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "validation_error" and "2000 errors" in error["message"]
    assert len(error["details"]) == MAX_REPORTED_ERRORS and error["details"][0]["loc"][:3] == ["body", "votes", 0]
