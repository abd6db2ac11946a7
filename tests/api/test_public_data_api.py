"""Public data for DP-CMF through HTTP and the CLI: the public-ratings consent (own user token
only, audited), similarity sources (declared public, with provenance) and their all-or-nothing,
idempotent top-K uploads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from app.config import get_settings
from app.errors import PayloadTooLarge
from tests.api.conftest import SMALL_DPALS, Env, add_items, seed_ratings

R = "/v1/datasets/default"
A = "/v1/admin/datasets/default"


def _ratings_version(env: Env) -> int:
    with env.session() as s:
        return int(s.execute(text("SELECT ratings_version FROM datasets WHERE name = 'default'")).scalar_one())


def _consent(env: Env, user: str, public: bool, headers: dict[str, str] | None = None):
    return env.client.put(f"{R}/users/{user}/public-ratings", json={"public": public},
                          headers=headers if headers is not None else env.auth(user))


# ---------------------------------------------------------------------------- consent
def test_only_the_users_own_token_sets_the_public_flag_and_every_change_is_audited(env: Env) -> None:
    v0 = _ratings_version(env)
    refused = {
        "other user": env.auth("bob"),
        "service acting for users": env.ingest_service,
        "admin": env.admin,
    }
    for who, headers in refused.items():
        r = _consent(env, "alice", True, headers)
        assert r.status_code == 403, (who, r.text)
        assert r.json()["error"]["code"] in {"own_user_required", "wrong_subject"}
    assert "own token" in _consent(env, "alice", True, env.admin).json()["error"]["message"]
    assert _consent(env, "alice", True, {}).status_code == 401
    assert env.count("public_rating_consent_events") == 0 and env.count("public_rating_consents") == 0
    assert _ratings_version(env) == v0
    # consent needs a JSON boolean: truthy look-alikes are refused, not coerced to true
    for truthy in (1, "yes", "true", "on", "t", 1.0):
        r = env.client.put(f"{R}/users/alice/public-ratings", json={"public": truthy}, headers=env.auth("alice"))
        assert r.status_code == 422, (truthy, r.text)
    assert env.count("public_rating_consents") == 0

    r = _consent(env, "alice", True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["public"] is True and body["changed"] is True and "cannot recall" in body["note"]
    assert _consent(env, "alice", True).json()["changed"] is False  # same choice again: no new event
    assert env.count("public_rating_consent_events") == 1
    assert _ratings_version(env) == v0 + 1
    assert _consent(env, "alice", False).json() | {"updated_at": None} == {
        "dataset": "default", "user_id": "alice", "public": False, "changed": True, "updated_at": None,
        "note": body["note"]}
    assert env.count("public_rating_consent_events") == 2 and _ratings_version(env) == v0 + 2

    # reading: the user, or a service acting for users; never another user
    assert env.client.get(f"{R}/users/alice/public-ratings", headers=env.auth("alice")).json()["public"] is False
    assert env.client.get(f"{R}/users/alice/public-ratings", headers=env.ingest_service).status_code == 200
    assert env.client.get(f"{R}/users/alice/public-ratings", headers=env.auth("bob")).status_code == 403
    assert env.client.get(f"{R}/users/carol/public-ratings", headers=env.auth("carol")).json()["public"] is False

    _consent(env, "bob", True)
    events = env.client.get(f"{A}/public-ratings/events", headers=env.admin).json()
    assert [(e["user_id"], e["public"], e["actor"]) for e in events["items"]] == [
        ("alice", True, "user:alice"), ("alice", False, "user:alice"), ("bob", True, "user:bob")]
    only_alice = env.client.get(f"{A}/public-ratings/events", params={"user_id": "alice"}, headers=env.admin).json()
    assert only_alice["total"] == 2
    users = env.client.get(f"{A}/public-users", headers=env.admin).json()
    assert [u["user_id"] for u in users["items"]] == ["bob"] and users["total"] == 1
    assert env.client.get(f"{A}/public-users", headers=env.auth("bob")).status_code == 403
    assert _consent(env, "alice", True, env.auth("alice")).status_code == 200
    assert env.client.put("/v1/datasets/nope/users/alice/public-ratings", json={"public": True},
                          headers=env.auth("alice")).status_code == 404


# ---------------------------------------------------------------------------- similarity sources
SOURCE = {"provenance": "https://example.org/public-item-graph (CC-BY)", "declared_public": True}


@pytest.mark.parametrize("body", [
    {"provenance": "https://example.org", "declared_public": False},
    {"provenance": "https://example.org"},
    {"provenance": "", "declared_public": True},
    {"provenance": "   ", "declared_public": True},
    {"declared_public": True},
    {**SOURCE, "extra": 1},
])
def test_a_source_must_declare_itself_public_and_give_its_provenance(sqlite_env: Env, body: dict) -> None:
    r = sqlite_env.client.put(f"{A}/similarity-sources/wiki", json=body, headers=sqlite_env.admin)
    assert r.status_code == 422, r.text
    assert sqlite_env.count("similarity_sources") == 0


def test_sources_are_admin_only_created_updated_listed_deleted(env: Env) -> None:
    url = f"{A}/similarity-sources/wiki"
    assert env.client.put(url, json=SOURCE, headers=env.ingest_service).status_code == 403
    r = env.client.put(url, json=SOURCE, headers=env.admin)
    assert r.status_code == 201 and r.json()["created_by"] == "admin:root" and r.json()["n_pairs"] == 0
    r = env.client.put(url, json={**SOURCE, "provenance": "doi:10.1/x"}, headers=env.admin)
    assert r.status_code == 200 and r.json()["provenance"] == "doi:10.1/x"
    assert env.client.get(f"{A}/similarity-sources", headers=env.admin).json()["total"] == 1
    assert env.client.put(f"{A}/similarity-sources/bad%20name", json=SOURCE, headers=env.admin).status_code == 422
    assert env.client.delete(url, headers=env.admin).status_code == 204
    assert env.client.get(url, headers=env.admin).status_code == 404
    assert env.client.delete(url, headers=env.admin).status_code == 404


def _rows(*lists: tuple[str, list[tuple[str, float]]]) -> dict:
    return {"rows": [{"item_id": i, "neighbours": [{"item_id": k, "score": s} for k, s in ns]} for i, ns in lists]}


def test_neighbour_upload_replaces_each_items_list_idempotently(env: Env) -> None:
    add_items(env, 6)
    env.client.put(f"{A}/similarity-sources/wiki", json=SOURCE, headers=env.admin)
    url = f"{A}/similarity-sources/wiki/neighbours"
    batch = _rows(("i0", [("i1", 0.9), ("i2", 0.5)]), ("i3", [("i4", 0.7)]))
    v0 = _ratings_version(env)
    for _ in range(2):
        r = env.client.post(url, json=batch, headers=env.admin)
        assert r.status_code == 200, r.text
        assert env.count("item_similarities") == 3
    assert r.json() == {"source": "wiki", "items": 2, "pairs_written": 3, "pairs_removed": 3}
    assert _ratings_version(env) > v0
    # a new list for i0 replaces the old one; i3's list is untouched; an empty list clears
    r = env.client.post(url, json=_rows(("i0", [("i5", 0.3)]), ("i4", [])), headers=env.admin)
    assert r.json()["pairs_removed"] == 2 and env.count("item_similarities") == 2
    got = env.client.get(f"{url}/i0", headers=env.admin).json()
    assert got["neighbours"] == [{"item_id": "i5", "score": 0.3}]
    assert env.client.get(f"{url}/i3", headers=env.admin).json()["neighbours"] == [{"item_id": "i4", "score": 0.7}]
    info = env.client.get(f"{A}/similarity-sources/wiki", headers=env.admin).json()
    assert info["n_items"] == 2 and info["n_pairs"] == 2
    assert env.client.post(url, json=batch, headers=env.ingest_service).status_code == 403
    assert env.client.post(f"{A}/similarity-sources/none/neighbours", json=batch, headers=env.admin).status_code == 404
    env.client.delete(f"{A}/similarity-sources/wiki", headers=env.admin)
    assert env.count("item_similarities") == 0


def test_a_bad_neighbour_batch_writes_nothing_and_reports_each_row(env: Env) -> None:
    add_items(env, 4)
    env.client.put(f"{A}/similarity-sources/wiki", json=SOURCE, headers=env.admin)
    url = f"{A}/similarity-sources/wiki/neighbours"
    assert env.client.post(url, json=_rows(("i0", [("i1", 1.0)])), headers=env.admin).status_code == 200
    before = env.count("item_similarities"), _ratings_version(env)
    bad = _rows(
        ("i1", [("i2", 0.5)]),                  # valid
        ("nope", [("i2", 0.5)]),                # unknown item
        ("i2", [("i2", 0.5)]),                  # self pair
        ("i3", [("i0", 0.5), ("i0", 0.4)]),     # repeated neighbour
        ("i0", [("ghost", 0.5)]),               # unknown neighbour (and would replace i0's list)
        ("i1", [("i3", 0.5)]),                  # item repeated in the batch
    )
    r = env.client.post(url, json=bad, headers=env.admin)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_rows" and err["details"]["n_invalid"] == 5
    assert [row["index"] for row in err["details"]["rows"]] == [1, 2, 3, 4, 5]
    assert "unknown neighbour 'ghost'" in err["details"]["rows"][3]["error"]
    assert (env.count("item_similarities"), _ratings_version(env)) == before
    for payload in ('{"rows": [{"item_id": "i1", "neighbours": [{"item_id": "i2", "score": NaN}]}]}',
                    '{"rows": [{"item_id": "i1", "neighbours": [{"item_id": "i2", "score": Infinity}]}]}',
                    '{"rows": [{"item_id": "i1", "neighbours": [{"item_id": "i2", "score": "0.5"}]}]}',
                    '{"rows": []}'):
        r = env.client.post(url, content=payload, headers={**env.admin, "Content-Type": "application/json"})
        assert r.status_code == 422, payload
    too_long = _rows(("i0", [(f"i{k % 4}", 0.1) for k in range(201)]))
    assert env.client.post(url, json=too_long, headers=env.admin).status_code == 422
    assert (env.count("item_similarities"), _ratings_version(env)) == before


def test_upload_size_caps(sqlite_env: Env) -> None:
    from app.services import public_data

    add_items(sqlite_env, 3)
    sqlite_env.client.put(f"{A}/similarity-sources/wiki", json=SOURCE, headers=sqlite_env.admin)
    with sqlite_env.session() as s:
        with pytest.raises(PayloadTooLarge):
            public_data.replace_neighbours(s, dataset="default", source="wiki", max_rows=1,
                                           rows=[("i0", [("i1", 1.0)]), ("i1", [("i2", 1.0)])])
        with pytest.raises(PayloadTooLarge):
            public_data.replace_neighbours(s, dataset="default", source="wiki", max_rows=10,
                                           rows=[("i0", [("i1", 1.0)] * (public_data.MAX_PAIRS_PER_BATCH + 1))])


def test_new_items_and_new_metadata_bump_ratings_version(sqlite_env: Env) -> None:
    env = sqlite_env
    url = f"{R}/items/x"
    v0 = _ratings_version(env)
    assert env.client.put(url, json={"categories": ["Drama"]}, headers=env.ingest_service).status_code == 201
    assert _ratings_version(env) == v0 + 1  # new item
    env.client.put(url, json={"categories": ["Drama"], "title": "X"}, headers=env.ingest_service)
    assert _ratings_version(env) == v0 + 1  # the title is not training data
    env.client.put(url, json={"categories": ["Drama"], "features": {"author": "Y"}}, headers=env.ingest_service)
    assert _ratings_version(env) == v0 + 2


def test_item_tokens() -> None:
    from app.services.public_data import item_tokens

    tokens = item_tokens([" Drama", "Comedy", ""], {"author": "X", "tags": ["a", " b ", 3], "year": 1999,
                                                   "score": 4.5, "award": True, "remake": False, " ": "y"})
    assert tokens == ["author:X", "award", "category:Comedy", "category:Drama", "tags:a", "tags:b"]
    assert item_tokens(None, None) == []


# ---------------------------------------------------------------------------- training over HTTP
def test_dpcmf_over_http_uses_public_data_and_recommends_a_cold_item(sqlite_env: Env) -> None:
    from app.services.training.runner import run_training

    env = sqlite_env
    seed_ratings(env)  # i0..i23 with categories "even"/"odd"
    r = env.client.put(f"{R}/items/new", headers=env.ingest_service, json={"title": "New", "categories": ["even"]})
    assert r.status_code == 201
    assert _consent(env, "u5", True).status_code == 200
    env.client.put(f"{A}/similarity-sources/wiki", json=SOURCE, headers=env.admin)
    env.client.post(f"{A}/similarity-sources/wiki/neighbours", headers=env.admin,
                    json=_rows(("new", [("i0", 0.9), ("i2", 0.8)])))
    hyper = {**SMALL_DPALS, "alpha_metadata": 1.0, "alpha_similarities": 1.0, "alpha_public_users": 1.0}
    r = env.client.post(f"{A}/trainings", headers=env.admin,
                        json={"algorithm": "dpcmf", "epsilon": 5.0, "hyperparameters": hyper})
    assert r.status_code == 202, r.text
    assert run_training(r.json()["run_id"], url=env.settings.database_url, settings=env.settings) == "succeeded"
    info = env.client.get(f"{R}/model").json()
    assert info["algorithm"] == "dpcmf"
    used = {s["name"]: s["rows"] for s in info["privacy"]["public_sources"]}
    assert used == {"metadata": 2, "similarities": 1, "public_users": 1}
    recs = env.client.get(f"{R}/users/u2/recommendations", params={"n": 50}, headers=env.auth("u2")).json()
    assert not recs["fallback"] and "new" in [x["item_id"] for x in recs["items"]]
    r = env.client.post(f"{A}/trainings", headers=env.admin,
                        json={"algorithm": "dpcmf", "epsilon": 1.0, "hyperparameters": {"alpha_metadata": -1}})
    assert r.status_code == 422


# ---------------------------------------------------------------------------- CLI
@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from app import cli
    from app.config import reset_settings_cache
    from app.db.session import dispose_engines

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("SECRET_KEY", "cli-tests-secret-0123456789abcdef-xyz")
    monkeypatch.delenv("REDIS_URL", raising=False)
    reset_settings_cache()
    assert cli.main(["migrate"]) == 0
    from app.db.session import session_scope
    from app.services import catalog, ingest

    with session_scope(get_settings().database_url) as s:
        catalog.import_items(s, dataset="default", rows=[(f"i{k}", None, []) for k in range(5)])
        ingest.import_ratings(s, dataset="default", rows=[("u0", f"i{k}", 3.0) for k in range(5)])
    yield tmp_path
    dispose_engines()
    reset_settings_cache()


def _pairs() -> int:
    from app.db.session import session_scope

    with session_scope(get_settings().database_url) as s:
        return int(s.execute(text("SELECT count(*) FROM item_similarities")).scalar_one())


def test_cli_import_similarities(cli_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app import cli

    good = cli_db / "sims.csv"
    good.write_text("item_id,neighbour_id,score\ni0,i1,0.9\ni0,i2,0.4\ni3,i4,0.8\n")
    args = ["import-similarities", str(good), "--source", "wiki", "--provenance", "https://example.org/graph"]
    with pytest.raises(SystemExit, match="declared_public"):
        cli.main(args)  # without --declare-public
    assert _pairs() == 0
    capsys.readouterr()
    assert cli.main([*args, "--declare-public"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["items"] == 2 and out["pairs_written"] == 3 and _pairs() == 3
    assert cli.main([*args, "--declare-public"]) == 0 and _pairs() == 3  # idempotent
    bad = cli_db / "bad.csv"
    bad.write_text("item_id,neighbour_id,score\ni0,i1,0.1\ni3,ghost,0.2\ni4,i4,1\ni2,i1,nan\n")
    with pytest.raises(SystemExit, match="nothing was written"):
        cli.main(["import-similarities", str(bad), "--source", "wiki", "--provenance", "x", "--declare-public"])
    assert _pairs() == 3
    bad.write_text("item_id,neighbour_id,score\ni0,i1,high\n")
    with pytest.raises(SystemExit, match="score is not a number"):
        cli.main(["import-similarities", str(bad), "--source", "wiki", "--provenance", "x", "--declare-public"])
