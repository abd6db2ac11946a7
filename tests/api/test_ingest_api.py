"""Ingest through HTTP on a real database: upserts, batches, deletes, items, bad input."""

from __future__ import annotations

import math

import pytest

from tests.api.conftest import Env, add_items

R = "/v1/datasets/default"


def _put(env: Env, user: str, item: str, value, headers=None):
    return env.client.put(f"{R}/users/{user}/ratings/{item}", json={"rating": value},
                          headers=headers or env.auth(user))


def test_upsert_is_idempotent_and_bumps_ratings_version(env: Env) -> None:
    add_items(env, 3)
    with env.session() as s:
        from app.db.models import Dataset
        v0 = s.query(Dataset).filter_by(name="default").one().ratings_version
    r = _put(env, "alice", "i0", 4.0)
    assert r.status_code == 201 and r.json()["status"] == "created"
    r = _put(env, "alice", "i0", 4.0)
    assert r.status_code == 200 and r.json()["status"] == "updated"
    r = _put(env, "alice", "i0", 2.5)
    assert r.json()["status"] == "updated"
    assert env.count("ratings") == 1
    page = env.client.get(f"{R}/users/alice/ratings", headers=env.auth("alice")).json()
    assert page["total"] == 1 and page["items"][0]["rating"] == 2.5
    with env.session() as s:
        from app.db.models import Dataset
        assert s.query(Dataset).filter_by(name="default").one().ratings_version > v0


def test_batch_upsert_per_row_results(env: Env) -> None:
    add_items(env, 5)
    _put(env, "u1", "i0", 3.0)
    rows = [{"user_id": f"u{k % 3}", "item_id": f"i{k % 5}", "rating": 1 + (k % 4)} for k in range(15)]
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["created"] == 14 and body["updated"] == 1
    assert [x["index"] for x in body["results"]] == list(range(15))
    assert body["results"][1] == {"index": 1, "user_id": "u1", "item_id": "i1", "status": "created", "error": None}
    assert env.count("ratings") == 15
    # the same batch again is idempotent: everything "updated", nothing new
    body = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service).json()
    assert body["created"] == 0 and body["updated"] == 15 and env.count("ratings") == 15


@pytest.mark.parametrize("payload", [
    '{"rating": NaN}', '{"rating": Infinity}', '{"rating": -Infinity}', '{"rating": 7.5}',
    '{"rating": 0.0}', '{"rating": "4"}', '{"rating": null}', '{}', '{"rating": 3, "extra": 1}',
])
def test_bad_single_ratings_refused_nothing_written(env: Env, payload: str) -> None:
    add_items(env, 1)
    before = env.count("ratings")
    r = env.client.put(f"{R}/users/alice/ratings/i0", content=payload,
                       headers={**env.auth("alice"), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] in {"validation_error", "rating_out_of_range"} and err["message"]
    assert env.count("ratings") == before and env.count("users") == 0


def test_malformed_json_is_400_in_the_error_shape(env: Env) -> None:
    add_items(env, 1)
    r = env.client.put(f"{R}/users/alice/ratings/i0", content='{"rating": 4',
                       headers={**env.auth("alice"), "Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "malformed_json"
    r = env.client.post(f"{R}/ratings/batch", content=b"\xff\xfe not json",
                        headers={**env.ingest_service, "Content-Type": "application/json"})
    assert r.status_code in (400, 422) and set(r.json()) == {"error"}
    assert env.count("ratings") == 0
    # bytes that are no JSON text at all (Schemathesis's workflows found them answered `http_error`)
    r = env.client.put(f"{R}/items/i1", content=b"w\xff\xfe",
                       headers={**env.ingest_service, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json", r.text


def test_unknown_item_single_is_404_and_batch_is_all_or_nothing(env: Env) -> None:
    add_items(env, 2)
    r = _put(env, "alice", "nope", 3.0)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_item"
    rows = [{"user_id": "a", "item_id": "i0", "rating": 3}, {"user_id": "a", "item_id": "zzz", "rating": 3},
            {"user_id": "b", "item_id": "i1", "rating": 9}, {"user_id": "a", "item_id": "i0", "rating": 4}]
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_rows" and err["details"]["n_invalid"] == 3
    assert [x["index"] for x in err["details"]["rows"]] == [1, 2, 3]
    assert env.count("ratings") == 0 and env.count("users") == 0


def test_batch_with_nan_row_refused(env: Env) -> None:
    add_items(env, 1)
    content = '{"ratings": [{"user_id": "a", "item_id": "i0", "rating": 3}, {"user_id": "b", "item_id": "i0", "rating": NaN}]}'
    r = env.client.post(f"{R}/ratings/batch", content=content,
                        headers={**env.ingest_service, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"][:3] == ["body", "ratings", 1]
    assert env.count("ratings") == 0


def test_oversized_batch_is_413_nothing_written(sqlite_env: Env) -> None:
    env = sqlite_env
    add_items(env, 1)
    rows = [{"user_id": f"u{k}", "item_id": "i0", "rating": 3} for k in range(10_001)]
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "batch_too_large"
    assert r.json()["error"]["details"] == {"max_rows": 10_000, "rows": 10_001}
    assert env.count("ratings") == 0
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": []}, headers=env.ingest_service)
    assert r.status_code == 422


def test_full_batch_of_10000_accepted(sqlite_env: Env) -> None:
    env = sqlite_env
    add_items(env, 10)
    rows = [{"user_id": f"u{k // 10}", "item_id": f"i{k % 10}", "rating": 0.5 + (k % 10) / 2} for k in range(10_000)]
    r = env.client.post(f"{R}/ratings/batch", json={"ratings": rows}, headers=env.ingest_service)
    assert r.status_code == 200 and r.json()["created"] == 10_000
    assert env.count("ratings") == 10_000 and env.count("users") == 1000


@pytest.mark.parametrize("query", ["limit=100000", "limit=0", "offset=-1", "offset=99999999999", "limit=abc"])
def test_huge_or_bad_pagination_refused(env: Env, query: str) -> None:
    r = env.client.get(f"{R}/items?{query}")
    assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error"
    r = env.client.get(f"{R}/users/alice/ratings?{query}", headers=env.auth("alice"))
    assert r.status_code == 422


def test_delete_rating_and_user(env: Env) -> None:
    add_items(env, 3)
    for item in ("i0", "i1", "i2"):
        _put(env, "alice", item, 4.0)
    _put(env, "bob", "i0", 2.0)
    r = env.client.delete(f"{R}/users/alice/ratings/i1", headers=env.auth("alice"))
    assert r.status_code == 200 and r.json()["deleted"] == 1
    assert env.client.delete(f"{R}/users/alice/ratings/i1", headers=env.auth("alice")).status_code == 404
    r = env.client.delete("/v1/users/alice", headers=env.auth("alice"))
    assert r.status_code == 200 and r.json()["deleted"] == 2 and "next retrain" in r.json()["note"]
    assert env.count("ratings") == 1 and env.count("users") == 1
    assert env.client.delete("/v1/users/alice", headers=env.auth("alice")).status_code == 404


def test_items_crud_and_paging(env: Env) -> None:
    add_items(env, 5, categories=lambda k: ["x"] if k < 2 else ["y", "z"])
    r = env.client.put(f"{R}/items/i1", headers=env.admin,
                       json={"title": "Renamed", "categories": ["q"], "features": {"year": 1999, "tags": ["a"]},
                             "active": False})
    assert r.status_code == 200
    got = env.client.get(f"{R}/items/i1").json()
    assert got == {"item_id": "i1", "title": "Renamed", "categories": ["q"],
                   "features": {"year": 1999, "tags": ["a"]}, "active": False}
    page = env.client.get(f"{R}/items?limit=2&offset=2").json()
    assert page["total"] == 5 and [i["item_id"] for i in page["items"]] == ["i2", "i3"] and page["next_offset"] == 4
    assert env.client.get(f"{R}/items?offset=4").json()["next_offset"] is None
    assert env.count("items") == 5
    assert env.client.get(f"{R}/items/none").status_code == 404
    assert env.client.get("/v1/datasets/nope/items").json()["error"]["code"] == "unknown_dataset"


def test_unknown_route_and_method_use_error_shape(sqlite_env: Env) -> None:
    r = sqlite_env.client.get("/v1/no/such/route")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = sqlite_env.client.patch("/health")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert not math.isnan(1.0)


def test_oversized_body_is_413_in_the_error_shape(sqlite_env: Env) -> None:
    env = sqlite_env
    blob = b'{"ratings": [' + b'{"user_id": "u", "item_id": "i0", "rating": 3},' * 400_000 + b'{}]}'
    r = env.client.post(f"{R}/ratings/batch", content=blob,
                        headers={**env.ingest_service, "Content-Type": "application/json"})
    assert r.status_code == 413 and set(r.json()) == {"error"}
    assert env.count("ratings") == 0
    chunks = (blob[k:k + 65536] for k in range(0, len(blob), 65536))  # streamed: no Content-Length
    r = env.client.post(f"{R}/ratings/batch", content=chunks,
                        headers={**env.ingest_service, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert env.count("ratings") == 0


def test_unexpected_errors_are_500_in_the_shape_without_private_values(sqlite_env: Env, caplog, monkeypatch) -> None:
    from app.services import ingest

    def boom(*_a, **kw):
        raise RuntimeError(f"private value {kw['rating']} of {kw['user_id']}")

    monkeypatch.setattr(ingest, "upsert_rating", boom)
    client = __import__("fastapi.testclient", fromlist=["TestClient"]).TestClient(
        sqlite_env.client.app, raise_server_exceptions=False)
    with caplog.at_level("ERROR", logger="privrec.api"):
        r = client.put(f"{R}/users/alice/ratings/i0", json={"rating": 4.5}, headers=sqlite_env.auth("alice"))
    assert r.status_code == 500 and r.json() == {"error": {"code": "internal_error",
                                                           "message": "unexpected server error", "details": None}}
    assert "RuntimeError" in caplog.text and "4.5" not in caplog.text
    assert "private value" not in caplog.text.replace("private value {", "")


def test_bulk_import_round_trips_awkward_ids(env: Env) -> None:
    """CSV ids are free text: quotes, backslashes, commas, braces, 'NULL', unicode survive."""
    from app.services import catalog, ingest

    weird = ['a"b', "c\\d", "e,f", "{g}", "NULL", "ünï ✓", " sp "]
    rows = [(u, i, 1.0 + k % 4) for k, (u, i) in enumerate((u, i) for u in weird for i in weird)]
    with env.session() as s:
        assert catalog.import_items(s, dataset="default", rows=[(i, None, []) for i in weird]) == {
            "created": len(weird), "updated": 0}
        assert ingest.import_ratings(s, dataset="default", rows=rows) == len(rows)
        s.commit()
    with env.session() as s:
        for u in weird:
            page = ingest.list_user_ratings(s, dataset="default", user_id=u, offset=0, limit=100)
            assert sorted(r.item_id for r in page.items) == sorted(weird)
    assert env.count("ratings") == len(rows)
    with env.session() as s:  # again: every row is an update
        ingest.import_ratings(s, dataset="default", rows=rows)
        s.commit()
    assert env.count("ratings") == len(rows)
