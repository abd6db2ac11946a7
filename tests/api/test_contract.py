"""API contract edges found by fuzzing: 32-bit ids, huge caps, zoned timestamps, Allow on 405,
messages of read routes, database down -> 503, per-data-set model version numbers."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.db.session import dispose_engines
from app.main import create_app
from tests.api.conftest import Env, make_settings, seed_ratings, train_and_publish


def test_ids_beyond_32_bits_are_422_not_500(env: Env) -> None:
    for path in ("/v1/admin/trainings/2147483648", "/v1/admin/trainings/99999999999999999999"):
        r = env.client.get(path, headers=env.admin)
        assert r.status_code == 422, r.text
    r = env.client.post("/v1/admin/datasets/default/models/2147483648/activate", headers=env.admin)
    assert r.status_code == 422, r.text
    assert env.client.get("/v1/admin/trainings/2147483647", headers=env.admin).status_code == 404


def test_huge_epsilon_cap_is_422(env: Env) -> None:
    for cap in (1e23, 1e300):
        r = env.client.patch("/v1/admin/datasets/default/budget", headers=env.admin,
                             json={"epsilon_cap": cap, "reason": "fuzz"})
        assert r.status_code == 422, r.text
        r = env.client.post("/v1/admin/datasets", headers=env.admin, json={
            "name": "big", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": cap, "delta": 1e-6})
        assert r.status_code == 422, r.text
    assert env.client.get("/v1/admin/datasets/default/budget", headers=env.admin).json()["epsilon_cap"] == 10.0


def test_similarity_source_timestamps_carry_a_zone(env: Env) -> None:
    r = env.client.put("/v1/admin/datasets/default/similarity-sources/s", headers=env.admin,
                       json={"provenance": "https://example.org", "declared_public": True})
    assert r.status_code in (200, 201), r.text
    for key in ("created_at", "updated_at"):
        assert r.json()[key].endswith(("+00:00", "Z")), r.json()[key]
    got = env.client.get("/v1/admin/datasets/default/similarity-sources/s", headers=env.admin).json()
    assert got["created_at"].endswith(("+00:00", "Z")), got


def test_405_lists_every_method_of_the_path(sqlite_env: Env) -> None:
    r = sqlite_env.client.post("/v1/admin/datasets/default/budget", headers=sqlite_env.admin, json={})
    assert r.status_code == 405
    assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "PATCH"}
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_a_bad_query_on_a_read_route_does_not_talk_about_writing(sqlite_env: Env) -> None:
    r = sqlite_env.client.get("/v1/datasets/default/items?limit=0")
    assert r.status_code == 422
    assert "written" not in r.json()["error"]["message"]
    r = sqlite_env.client.patch("/v1/admin/datasets/default/budget", headers=sqlite_env.admin, json={"epsilon_cap": "x"})
    assert r.status_code == 422 and "nothing was written" in r.json()["error"]["message"]


def test_database_down_is_503(tmp_path: Path) -> None:
    # production mode (a Redis URL): nothing touches the database at start-up
    settings = make_settings("postgresql+psycopg://postgres@127.0.0.1:1/none", tmp_path).model_copy(
        update={"redis_url": "redis://127.0.0.1:6379/6"})
    try:
        with TestClient(create_app(settings)) as client:
            r = client.get("/v1/datasets/default/items")
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
            assert "127.0.0.1" not in r.text
    finally:
        dispose_engines()


def test_model_versions_are_numbered_per_data_set(env: Env) -> None:
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={
        "name": "other", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": 10.0, "delta": 1e-6})
    assert r.status_code == 201, r.text
    seed_ratings(env)
    seed_ratings(env, dataset="other")
    train_and_publish(env, epsilon=1.0)
    train_and_publish(env, epsilon=1.0, dataset="other")
    train_and_publish(env, epsilon=1.0)
    mine = env.client.get("/v1/admin/datasets/default/models", headers=env.admin).json()["items"]
    other = env.client.get("/v1/admin/datasets/other/models", headers=env.admin).json()["items"]
    assert sorted(m["dataset_version"] for m in mine) == [1, 2]
    assert [m["dataset_version"] for m in other] == [1]
    assert len({m["id"] for m in mine + other}) == 3


def test_links_name_real_operations_and_their_parameters() -> None:
    """Every OpenAPI link (app.api.contract.LINKS) names an existing operation and only path
    parameters it has, from a 2xx answer; Schemathesis's stateful phase follows them."""
    from app.api.contract import LINKS
    from app.main import openapi_document

    doc = openapi_document()
    by_id = {op["operationId"]: (path, op) for path, ops in doc["paths"].items() for op in ops.values()}
    followed = set()
    for (method, path), links in LINKS.items():
        responses = doc["paths"][path][method.lower()]["responses"]
        ok = [status for status in responses if status.startswith("2")]
        assert ok, (method, path)
        for status in ok:
            assert set(responses[status]["links"]) == set(links)
            for name, link in responses[status]["links"].items():
                target_path, target = by_id[link["operationId"]]
                names = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
                assert set(link["parameters"]) <= names, (name, target_path)
                assert all(v.startswith(("$request.path.", "$response.body#/")) for v in link["parameters"].values())
                followed.add(target_path)
    assert "/v1/admin/trainings/{run_id}/cancel" in followed


def test_one_version_naming_across_the_api(env: Env) -> None:
    """`model_version` is the global id everywhere, `dataset_version` the data set's number; the
    deprecated `version` fields keep their old values until API v2."""
    seed_ratings(env)
    train_and_publish(env, epsilon=1.0)
    train_and_publish(env, epsilon=1.0)
    info = env.client.get("/v1/datasets/default/model").json()
    (listed,) = [m for m in env.client.get("/v1/admin/datasets/default/models", headers=env.admin).json()["items"]
                 if m["active"]]
    recs = env.client.get("/v1/datasets/default/popular").json()
    assert info["model_version"] == listed["model_version"] == listed["id"] == recs["model_version"]
    assert info["dataset_version"] == listed["dataset_version"] == 2
    assert info["version"] == info["model_version"] and listed["version"] == listed["dataset_version"]
    schema = env.client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["ModelInfoOut"]["properties"]["version"]["deprecated"] is True
    assert schema["ModelVersionOut"]["properties"]["version"]["deprecated"] is True
