"""Votes through HTTP on SQLite and PostgreSQL: raw upserts, randomised response at ingestion
(raw votes never stored, never re-randomised, per-user cap), client randomisation, vote settings
and their ledger entry, validation and auth."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import inspect, select, text

from app import ledger
from app.config import get_settings
from app.core.onebit import flip_probability
from app.db.models import Dataset, Item, LedgerEntry, User, Vote, VoteAllowance
from tests.api.conftest import Env, add_items, create_votes_dataset

DS = "votes"  # randomised response hides vote values only: its data set declares that relation
R = f"/v1/datasets/{DS}"
SETTINGS = f"/v1/admin/datasets/{DS}/vote-settings"
LN3 = math.log(3.0)  # flip probability 1/(1+3) = 0.25


@pytest.fixture
def env(env: Env) -> Env:
    create_votes_dataset(env, DS)
    return env


@pytest.fixture
def sqlite_env(sqlite_env: Env) -> Env:
    create_votes_dataset(sqlite_env, DS)
    return sqlite_env


def _put(env: Env, user: str, item: str, body: dict, headers=None):
    return env.client.put(f"{R}/users/{user}/votes/{item}", json=body, headers=headers or env.auth(user))


def _settings(env: Env, eps0: float | None, cap: int | None):
    return env.client.put(SETTINGS, json={"local_epsilon": eps0, "votes_per_user_cap": cap}, headers=env.admin)


def _stored(env: Env) -> list[Vote]:
    with env.session() as s:
        return list(s.scalars(select(Vote).order_by(Vote.id)))


def _ratings_version(env: Env) -> int:
    with env.session() as s:
        return s.scalar(select(Dataset.ratings_version).where(Dataset.name == DS))


def _table_counts(env: Env) -> dict[str, int]:
    with env.session() as s:
        names = inspect(s.get_bind()).get_table_names()
        return {t: int(s.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one()) for t in names}


# ----------------------------------------------------------------------------- raw data sets
def test_raw_votes_are_idempotent_upserts(env: Env) -> None:
    add_items(env, 3, DS)
    v0 = _ratings_version(env)
    r = _put(env, "alice", "i0", {"vote": 1})
    assert r.status_code == 201, r.text
    assert r.json() == {"user_id": "alice", "item_id": "i0", "status": "created", "stored_vote": 1,
                        "randomised": False, "randomised_by": None, "local_epsilon": None}
    updated = _put(env, "alice", "i0", {"vote": 1})
    assert updated.status_code == 200 and updated.json()["status"] == "updated"
    assert _put(env, "alice", "i0", {"vote": -1}).json()["stored_vote"] == -1
    assert _ratings_version(env) >= v0 + 3
    page = env.client.get(f"{R}/users/alice/votes", headers=env.auth("alice")).json()
    assert page["total"] == 1 and page["items"][0]["vote"] == -1 and page["items"][0]["randomised"] is False
    # a client-randomised vote has no meaning on a raw data set
    r = _put(env, "alice", "i1", {"vote": 1, "randomised": True, "local_epsilon": 1.0})
    assert r.status_code == 422 and r.json()["error"]["code"] == "randomised_not_accepted"
    assert env.count("votes") == 1
    r = env.client.delete(f"{R}/users/alice/votes/i0", headers=env.auth("alice"))
    assert r.status_code == 200 and r.json()["deleted"] == 1
    assert env.client.delete(f"{R}/users/alice/votes/i0", headers=env.auth("alice")).status_code == 404
    assert env.count("votes") == 0


BAD_VOTES = [
    '{"vote": true}', '{"vote": false}', '{"vote": 1.0}', '{"vote": -1.0}', '{"vote": 0}', '{"vote": 2}',
    '{"vote": -2}', '{"vote": "1"}', '{"vote": null}', '{}', '{"vote": 1, "extra": 1}',
    '{"vote": 1, "local_epsilon": 1.0}', '{"vote": 1, "randomised": true}',
    '{"vote": 1, "randomised": "true", "local_epsilon": 1.0}', '{"vote": 1, "randomised": true, "local_epsilon": NaN}',
    '{"vote": 1, "randomised": true, "local_epsilon": -1}', '{"vote": NaN}', '{"vote": 1, "randomised": 1}',
]


def test_bad_votes_refused_nothing_written(env: Env) -> None:
    add_items(env, 1, DS)
    assert _settings(env, LN3, 5).status_code == 200
    before = _table_counts(env)
    for payload in BAD_VOTES:
        r = env.client.put(f"{R}/users/alice/votes/i0", content=payload,
                           headers={**env.auth("alice"), "Content-Type": "application/json"})
        assert r.status_code == 422, (payload, r.text)
        assert r.json()["error"]["message"]
    assert _table_counts(env) == before


def test_batch_validation_is_all_or_nothing(env: Env) -> None:
    add_items(env, 2, DS)
    rows = [{"user_id": "a", "item_id": "i0", "vote": 1}, {"user_id": "a", "item_id": "zzz", "vote": 1},
            {"user_id": "a", "item_id": "i1", "vote": -1, "randomised": True, "local_epsilon": 1.0},
            {"user_id": "a", "item_id": "i0", "vote": -1}]
    # only the user's own token may declare client-side randomisation: a service gets 403
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service)
    assert r.status_code == 403 and r.json()["error"]["code"] == "client_randomisation_forbidden"
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.auth("a"))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_rows" and err["details"]["n_invalid"] == 3
    assert [x["index"] for x in err["details"]["rows"]] == [1, 2, 3]
    assert env.count("votes") == 0 and env.count("users") == 0
    r = env.client.post(f"{R}/votes/batch", json={"votes": [{"user_id": "a", "item_id": "i0", "vote": 0}]},
                        headers=env.ingest_service)
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"][:3] == ["body", "votes", 0]
    assert env.client.post(f"{R}/votes/batch", json={"votes": []}, headers=env.ingest_service).status_code == 422


def test_oversized_vote_batch_is_413(sqlite_env: Env) -> None:
    env = sqlite_env
    add_items(env, 1, DS)
    rows = [{"user_id": f"u{k}", "item_id": "i0", "vote": 1} for k in range(10_001)]
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service)
    assert r.status_code == 413 and r.json()["error"]["code"] == "batch_too_large"
    assert env.count("votes") == 0


def test_unknown_dataset_and_item(env: Env) -> None:
    add_items(env, 1, DS)
    r = env.client.put("/v1/datasets/nope/users/alice/votes/i0", json={"vote": 1}, headers=env.auth("alice"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_dataset"
    r = _put(env, "alice", "nope", {"vote": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_item"
    assert env.count("votes") == 0 and env.count("users") == 0


def test_vote_auth_matrix(sqlite_env: Env) -> None:
    env = sqlite_env
    add_items(env, 1, DS)
    url = f"{R}/users/alice/votes/i0"
    assert env.client.put(url, json={"vote": 1}).status_code == 401
    assert env.client.put(url, json={"vote": 1}, headers=env.auth("bob")).status_code == 403
    assert env.client.put(url, json={"vote": 1}, headers=env.auth("svc", "service", ("act_for_users",))).status_code == 403
    assert env.client.put(url, json={"vote": 1}, headers=env.auth("svc", "service", ("ingest",))).status_code == 201
    assert env.client.put(url, json={"vote": 1}, headers=env.auth("alice")).status_code == 200  # not created
    listing = f"{R}/users/alice/votes"
    assert env.client.get(listing).status_code == 401
    assert env.client.get(listing, headers=env.auth("bob")).status_code == 403
    assert env.client.get(listing, headers=env.auth("svc", "service", ("ingest",))).status_code == 403
    assert env.client.get(listing, headers=env.auth("svc", "service", ("act_for_users",))).status_code == 200
    batch = {"votes": [{"user_id": "alice", "item_id": "i0", "vote": -1}]}
    assert env.client.post(f"{R}/votes/batch", json=batch, headers=env.auth("bob")).status_code == 403
    assert env.client.post(f"{R}/votes/batch", json=batch, headers=env.auth("alice")).status_code == 200
    assert env.client.delete(url, headers=env.auth("bob")).status_code == 403
    assert env.client.get(SETTINGS, headers=env.auth("alice")).status_code == 403
    assert env.client.put(SETTINGS, json={"local_epsilon": 1.0, "votes_per_user_cap": 5},
                          headers=env.ingest_service).status_code == 403
    assert env.count("votes") == 1


# ----------------------------------------------------------------------------- randomised response
def test_raw_votes_never_persisted_with_randomisation_on(env: Env) -> None:
    """2,000 thumbs-up from 400 users: only randomised bits are stored, about 25% flipped to -1.

    The server seeds its generator from the OS CSPRNG, so no fixed seed exists: the flip count
    is Binomial(2000, 0.25) (mean 500, sd 19.4) and the test accepts 5 sd either side (the
    chance of a false failure is below 1e-6)."""
    n_users, n_items = 400, 5  # user level 5 ln 3 = 5.5 fits the default budget cap of 10
    add_items(env, n_items, DS)
    assert _settings(env, LN3, n_items).status_code == 200
    before = _table_counts(env)
    v0 = _ratings_version(env)
    rows = [{"user_id": f"u{u}", "item_id": f"i{i}", "vote": 1} for u in range(n_users) for i in range(n_items)]
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service)
    assert r.status_code == 200, r.text
    assert r.json()["created"] == len(rows)
    stored = _stored(env)
    assert len(stored) == len(rows)
    assert all(v.randomised and v.randomised_by == "server" and v.local_epsilon == LN3 for v in stored)
    assert {v.value for v in stored} <= {-1, 1}
    n, p = len(rows), flip_probability(LN3)
    assert p == pytest.approx(0.25)
    flipped = sum(v.value == -1 for v in stored)
    assert abs(flipped - n * p) <= 5 * math.sqrt(n * p * (1 - p)), flipped
    # nothing else could hold a raw vote: only votes, users and allowances grew, by exactly this much
    after = _table_counts(env)
    grown = {t: after[t] - before[t] for t in after if after[t] != before[t]}
    assert grown == {"votes": n, "users": n_users, "vote_allowances": n_users}
    with env.session() as s:
        assert {a.randomised_votes for a in s.scalars(select(VoteAllowance))} == {n_items}
    assert _ratings_version(env) == v0 + n
    # the user's own listing shows the stored bits, never the raw ones
    page = env.client.get(f"{R}/users/u0/votes", headers=env.auth("u0")).json()
    with env.session() as s:
        uid = s.scalar(select(User.id).where(User.external_id == "u0"))
        external = dict(s.execute(select(Item.id, Item.external_id)).all())
    mine = {external[v.item_id]: v.value for v in stored if v.user_id == uid}
    assert page["total"] == len(mine) == n_items
    assert {x["item_id"]: x["vote"] for x in page["items"]} == mine


def test_a_vote_is_never_rerandomised_and_the_cap_holds(env: Env) -> None:
    add_items(env, 5, DS)
    assert _settings(env, 1.0, 3).status_code == 200
    first = _put(env, "alice", "i0", {"vote": 1}).json()
    assert first["status"] == "created" and first["randomised_by"] == "server"
    v = _ratings_version(env)
    for k in range(12):  # resubmissions (either way) never touch the stored bit
        again = _put(env, "alice", "i0", {"vote": 1 if k % 2 else -1}).json()
        assert again["status"] == "unchanged" and again["stored_vote"] == first["stored_vote"]
    assert _ratings_version(env) == v  # nothing changed: no retraining trigger
    assert [x.value for x in _stored(env)] == [first["stored_vote"]]
    assert _put(env, "alice", "i1", {"vote": -1}).status_code == 201
    assert _put(env, "alice", "i2", {"vote": -1}).status_code == 201
    r = _put(env, "alice", "i3", {"vote": 1})
    assert r.status_code == 409 and r.json()["error"]["code"] == "vote_cap_exceeded"
    assert r.json()["error"]["details"]["users"] == [{"user_id": "alice", "current": 3, "new": 1}]
    assert env.count("votes") == 3
    # a delete never gives the allowance back: voting on i0 again would be a fresh randomisation
    assert env.client.delete(f"{R}/users/alice/votes/i0", headers=env.auth("alice")).status_code == 200
    assert _put(env, "alice", "i0", {"vote": 1}).status_code == 409
    assert env.count("votes") == 2
    # a batch with one user over the cap writes nothing at all
    rows = [{"user_id": "bob", "item_id": "i0", "vote": 1}, {"user_id": "alice", "item_id": "i4", "vote": 1}]
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service)
    assert r.status_code == 409 and env.count("votes") == 2
    with env.session() as s:
        assert s.scalars(select(VoteAllowance.randomised_votes)).all() == [3]
    # a batch mixing an existing pair (unchanged) and new ones
    rows = [{"user_id": "alice", "item_id": "i1", "vote": 1}, {"user_id": "bob", "item_id": "i0", "vote": 1}]
    body = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service).json()
    assert (body["created"], body["unchanged"], body["updated"]) == (1, 1, 0)
    assert [x["status"] for x in body["results"]] == ["unchanged", "created"]


def test_client_randomised_votes_are_stored_as_sent(env: Env) -> None:
    add_items(env, 10, DS)
    assert _settings(env, LN3, 9).status_code == 200  # user level 9 ln 3 < 10
    sent = [1, -1, -1, 1, 1, -1, 1, -1, -1]
    rows = [{"user_id": "carol", "item_id": f"i{k}", "vote": v, "randomised": True, "local_epsilon": LN3}
            for k, v in enumerate(sent)]
    r = env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.auth("carol"))
    assert r.status_code == 200, r.text
    stored = _stored(env)
    assert [v.value for v in stored] == sent and {v.randomised_by for v in stored} == {"client"}
    # the declaration must match the data set's epsilon0 exactly
    r = _put(env, "dave", "i0", {"vote": 1, "randomised": True, "local_epsilon": 1.0})
    assert r.status_code == 422 and r.json()["error"]["code"] == "local_epsilon_mismatch"
    assert env.count("votes") == len(sent)


# ----------------------------------------------------------------------------- settings and ledger
def test_vote_settings_record_the_local_guarantee_once(env: Env) -> None:
    add_items(env, 2, DS)
    r = env.client.get(SETTINGS, headers=env.admin)
    assert r.status_code == 200 and r.json()["randomised_at_ingestion"] is False
    r = env.client.put(SETTINGS, json={"local_epsilon": 1.0}, headers=env.admin)
    assert r.status_code == 422  # a cap is required
    out = _settings(env, 0.5, 4).json()
    assert out["randomised_at_ingestion"] and out["user_level_epsilon"] == pytest.approx(2.0)
    assert out["flip_probability"] == pytest.approx(1 / (1 + math.exp(0.5)))
    assert _settings(env, 0.5, 4).json()["local_ledger_seq"] == out["local_ledger_seq"]  # same values: no new entry
    entries = env.client.get(f"/v1/admin/datasets/{DS}/ledger", headers=env.admin).json()["items"]
    local = [e for e in entries if e["kind"] == "local"]
    assert len(local) == 1 and local[0]["seq"] == out["local_ledger_seq"]
    params = local[0]["parameters"]
    assert params["local_epsilon"] == 0.5 and params["votes_per_user_cap"] == 4 and params["level"] == "user"
    assert params["neighbouring_relation"] == "replace_vote_values" and "NOT hidden" in params["relation"]
    assert local[0]["event"] is not None and local[0]["epsilon"] > 0
    budget = env.client.get(f"/v1/admin/datasets/{DS}/budget", headers=env.admin).json()
    assert budget["spent_epsilon_rdp"] == pytest.approx(local[0]["spent_epsilon_rdp"])
    assert budget["spent_epsilon_rdp"] >= local[0]["epsilon"] > 0
    assert budget["n_local_guarantees"] == 1 and budget["n_charged_runs"] == 0
    # the dashboard says in which sense the spend protects users: RR hides values, not membership
    assert budget["neighbouring_relation"] == "replace_vote_values"
    assert budget["neighbouring_relations"] == ["replace_vote_values"]
    assert budget["person_budget"]["name"] == DS and budget["person_budget"]["datasets"] == [DS]
    assert budget["person_budget"]["spent_epsilon_rdp"] == pytest.approx(budget["spent_epsilon_rdp"])
    with env.session() as s:
        ds = s.scalar(select(Dataset).where(Dataset.name == DS))
        acct = ledger.account_for(s, ds.id)
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
        assert ledger.spent(s, acct, recompute=True).epsilon_rdp == pytest.approx(budget["spent_epsilon_rdp"], abs=1e-6)
    # once a vote exists the settings are frozen
    assert _put(env, "alice", "i0", {"vote": 1}).status_code == 201
    r = _settings(env, 0.5, 5)
    assert r.status_code == 409 and r.json()["error"]["code"] == "votes_exist"
    assert _settings(env, None, None).status_code == 409
    # ... even after the vote is deleted (a randomised bit was given out)
    env.client.delete(f"{R}/users/alice/votes/i0", headers=env.auth("alice"))
    assert _settings(env, None, None).status_code == 409


def test_vote_settings_over_the_budget_are_refused(env: Env) -> None:
    r = _settings(env, 2.0, 100)  # user level 200 > the default cap of 10
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "budget_exceeded"
    assert err["details"]["epsilon_cap"] == 10.0 and err["details"]["requested_epsilon"] > 10.0
    assert "prior_spent_epsilon" in err["details"]
    assert env.client.get(SETTINGS, headers=env.admin).json()["randomised_at_ingestion"] is False
    with env.session() as s:
        assert s.scalar(select(LedgerEntry.id).where(LedgerEntry.kind == "local")) is None


def test_votes_to_onebit_model_to_recommendations_over_http(env: Env) -> None:
    """Settings -> randomised votes -> onebit run without epsilon (post-processing, charged 0)
    -> privileged probabilities for a voter, the DP-popular fallback for a non-voter."""
    from app.services.training.runner import run_training

    add_items(env, 12, DS)
    assert _settings(env, 2.0, 4).status_code == 200
    rows = [{"user_id": f"u{u}", "item_id": f"i{(u + k) % 12}", "vote": 1 if (u + k) % 2 == 0 else -1}
            for u in range(40) for k in range(4)]
    assert env.client.post(f"{R}/votes/batch", json={"votes": rows}, headers=env.ingest_service).status_code == 200
    spent = env.client.get(f"/v1/admin/datasets/{DS}/budget", headers=env.admin).json()["spent_epsilon_rdp"]
    r = env.client.post(f"/v1/admin/datasets/{DS}/trainings", headers=env.admin,
                        json={"algorithm": "onebit", "hyperparameters": {"rank": 2, "n_steps": 10}})
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    assert run_training(run_id, url=env.settings.database_url, settings=env.settings) == "succeeded"
    run = env.client.get(f"/v1/admin/trainings/{run_id}", headers=env.admin).json()
    assert run["epsilon_charged"] == 0.0 and run["config"]["pre_randomised"] is True
    assert env.client.get(f"/v1/admin/datasets/{DS}/budget", headers=env.admin).json()["spent_epsilon_rdp"] == spent
    kinds = [e["kind"] for e in env.client.get(f"/v1/admin/datasets/{DS}/ledger", headers=env.admin).json()["items"]]
    assert kinds == ["open", "local", "reservation", "commit"]
    out = env.client.get(f"{R}/users/u0/recommendations?n=5", headers=env.auth("u0")).json()
    assert out["algorithm"] == "onebit" and not out["fallback"] and len(out["items"]) == 5
    assert all(0.0 <= it["score"] <= 1.0 for it in out["items"])
    assert env.client.get(f"{R}/users/u0/recommendations", headers=env.auth("u1")).status_code == 403
    out = env.client.get(f"{R}/users/nobody/recommendations?n=3", headers=env.auth("nobody")).json()
    assert out["fallback"] and out["fallback_reason"] == "dp_popular: user has no votes"
    # a charged algorithm still needs its epsilon
    r = env.client.post(f"/v1/admin/datasets/{DS}/trainings", headers=env.admin, json={"algorithm": "dpals"})
    assert r.status_code == 422


def test_cli_import_votes_randomises_on_arrival(tmp_path, monkeypatch, capsys) -> None:
    """`privrec import-votes` goes through the ingestion path: only randomised bits are stored."""
    import json

    from app import cli
    from app.config import reset_settings_cache
    from app.db.session import dispose_engines, session_scope
    from app.schemas.ingest import ItemIn
    from app.services import budget, catalog, votes

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("SECRET_KEY", "cli-tests-secret-0123456789abcdef-xyz")
    monkeypatch.delenv("REDIS_URL", raising=False)
    reset_settings_cache()
    try:
        assert cli.main(["migrate"]) == 0
        with session_scope(get_settings().database_url) as s:
            budget.put_person_budget(s, name=DS, epsilon_cap=10.0, delta=1e-6, relation="replace_vote_values",
                                     reason=None, actor="test")
            budget.ensure_dataset(s, DS, rating_min=1.0, rating_max=5.0, epsilon_cap=10.0, delta=1e-6,
                                  relation="replace_vote_values", person_budget=DS)
            for k in range(4):
                catalog.upsert_item(s, dataset=DS, item_id=f"i{k}", data=ItemIn())
            votes.set_vote_settings(s, dataset=DS, local_epsilon=LN3, votes_per_user_cap=4, actor="test")
        path = tmp_path / "votes.csv"
        path.write_text("user,item,vote\n" + "".join(f"u{u},i{k},1\n" for u in range(30) for k in range(4)))
        capsys.readouterr()
        assert cli.main(["import-votes", str(path), "--dataset", DS, "--chunk", "50"]) == 0
        assert json.loads(capsys.readouterr().out)["created"] == 120
        with session_scope(get_settings().database_url) as s:
            stored = list(s.scalars(select(Vote)))
        assert len(stored) == 120 and all(v.randomised and v.randomised_by == "server" for v in stored)
        bad = tmp_path / "bad.csv"
        bad.write_text("user,item,vote\nz,i0,1\nz,i1,1.0\n")
        with pytest.raises(SystemExit, match="vote 1 or -1"):
            cli.main(["import-votes", str(bad), "--dataset", DS])
        with session_scope(get_settings().database_url) as s:
            assert s.scalar(select(text("count(*)")).select_from(Vote)) == 120
    finally:
        dispose_engines()
        reset_settings_cache()


def test_deleting_a_user_removes_their_votes_and_moves_the_counter(env: Env) -> None:
    add_items(env, 2, DS)
    assert _settings(env, 1.0, 2).status_code == 200
    for item in ("i0", "i1"):
        assert _put(env, "erin", item, {"vote": 1}).status_code == 201
    assert _put(env, "frank", "i0", {"vote": -1}).status_code == 201
    v = _ratings_version(env)
    assert env.client.delete("/v1/users/erin", headers=env.auth("erin")).status_code == 200
    assert env.count("votes") == 1
    assert _ratings_version(env) == v + 2
    # the allowance outlives the user: re-created under the same id, erin gets no fresh bits
    # (otherwise delete + re-vote would collect independent randomisations of the same vote)
    assert env.count("vote_allowances") == 2
    r = _put(env, "erin", "i0", {"vote": 1})
    assert r.status_code == 409 and r.json()["error"]["code"] == "vote_cap_exceeded"
    assert env.count("votes") == 1
