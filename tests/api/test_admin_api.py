"""Admin API: budget, cap changes, ledger, trainings (202, 409), model versions."""

from __future__ import annotations

from itertools import pairwise

from app.core.privacy.accounting import NEIGHBOURING_RELATION
from tests.api.conftest import SMALL_DPALS, Env, seed_ratings, train_and_publish

A = "/v1/admin/datasets/default"


def test_budget_and_ledger_after_a_run(env: Env) -> None:
    seed_ratings(env)
    b0 = env.client.get(f"{A}/budget", headers=env.admin).json()
    assert b0["dataset"] == "default" and b0["spent_epsilon_rdp"] == 0 and b0["remaining_epsilon"] == b0["epsilon_cap"]
    train_and_publish(env, epsilon=1.5)
    b1 = env.client.get(f"{A}/budget", headers=env.admin).json()
    assert 0 < b1["spent_epsilon_rdp"] <= 1.5 + 1e-3
    assert b1["spent_epsilon_pld"] <= b1["spent_epsilon_rdp"] + 1e-3
    assert b1["remaining_epsilon"] <= b1["epsilon_cap"] - b1["spent_epsilon_rdp"] + 1e-9
    assert b1["runs"]["succeeded"] == 1
    assert b0["neighbouring_relations"] == [] and b1["neighbouring_relations"] == [NEIGHBOURING_RELATION]
    ledger = env.client.get(f"{A}/ledger", headers=env.admin, params={"limit": 100}).json()
    kinds = [e["kind"] for e in ledger["items"]]
    assert kinds[0] == "open" and "reservation" in kinds and ledger["total"] == len(kinds)
    res = next(e for e in ledger["items"] if e["kind"] == "reservation")
    assert res["event"] and "contribution_bound" in res["parameters"] and res["run_id"] is not None
    for prev, cur in pairwise(ledger["items"]):
        assert cur["prev_hash"] == prev["hash"]
    page = env.client.get(f"{A}/ledger", headers=env.admin, params={"limit": 1, "offset": 1}).json()
    assert len(page["items"]) == 1 and page["items"][0]["seq"] == ledger["items"][1]["seq"]


def test_cap_changes_are_audited_and_guarded(env: Env) -> None:
    seed_ratings(env)
    train_and_publish(env, epsilon=2.0)
    cap = env.client.get(f"{A}/budget", headers=env.admin).json()["epsilon_cap"]
    r = env.client.patch(f"{A}/budget", headers=env.admin, json={"epsilon_cap": cap + 5})
    assert r.status_code in (409, 422) and set(r.json()) == {"error"}  # raising needs a reason
    r = env.client.patch(f"{A}/budget", headers=env.admin, json={"epsilon_cap": cap + 5, "reason": "Q3 launch"})
    assert r.status_code == 200 and r.json()["epsilon_cap"] == cap + 5
    r = env.client.patch(f"{A}/budget", headers=env.admin, json={"epsilon_cap": 0.5})
    assert r.status_code == 409 and r.json()["error"]["code"] == "cap_change_refused"
    for bad in ({"epsilon_cap": -1}, {"epsilon_cap": "NaN"}, {"epsilon_cap": 3, "x": 1}):
        assert env.client.patch(f"{A}/budget", headers=env.admin, json=bad).status_code == 422
    entries = env.client.get(f"{A}/ledger", headers=env.admin).json()["items"]
    changes = [e for e in entries if e["kind"] == "cap_change"]
    assert len(changes) == 1 and changes[0]["reason"] == "Q3 launch" and changes[0]["actor"] == "admin:root"
    assert env.client.get(f"{A}/budget", headers=env.admin).json()["epsilon_cap"] == cap + 5


def test_training_requests_validated_and_409_on_exhaustion(env: Env) -> None:
    seed_ratings(env)
    runs0 = env.count("training_runs")
    for bad in ({}, {"epsilon": 1, "epsilon_fraction": 0.5}, {"epsilon": -1}, {"epsilon_fraction": 1.5},
                {"epsilon": 1, "algorithm": "nope"}, {"epsilon": 1, "hyperparameters": {"seed": 3}},
                {"epsilon": 1, "hyperparameters": {"no_such_knob": 3}}):
        r = env.client.post(f"{A}/trainings", headers=env.admin, json=bad)
        assert r.status_code == 422, (bad, r.text)
    assert env.count("training_runs") == runs0
    cap = env.client.get(f"{A}/budget", headers=env.admin).json()["epsilon_cap"]
    r = env.client.post(f"{A}/trainings", headers=env.admin, json={"epsilon": cap * 2, "hyperparameters": SMALL_DPALS})
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "budget_exceeded"
    assert {"prior_spent_epsilon", "requested_epsilon", "epsilon_cap"} <= set(err["details"])
    assert env.count("training_runs") == runs0
    r = env.client.post(f"{A}/trainings", headers=env.admin,
                        json={"epsilon_fraction": 0.5, "hyperparameters": SMALL_DPALS, "idempotency_key": "k1"})
    assert r.status_code == 202 and r.json()["status_url"].endswith(str(r.json()["run_id"]))
    again = env.client.post(f"{A}/trainings", headers=env.admin,
                            json={"epsilon_fraction": 0.5, "hyperparameters": SMALL_DPALS, "idempotency_key": "k1"})
    assert again.json()["run_id"] == r.json()["run_id"]
    run = env.client.get(f"/v1/admin/trainings/{r.json()['run_id']}", headers=env.admin).json()
    assert run["status"] == "queued" and run["progress"] == 0.0 and run["requested_epsilon"] <= cap / 2
    listing = env.client.get(f"{A}/trainings", headers=env.admin).json()
    assert listing["total"] == 1
    assert env.client.get("/v1/admin/trainings/424242", headers=env.admin).status_code == 404


def test_unknown_dataset_on_admin_routes(sqlite_env: Env) -> None:
    r = sqlite_env.client.get("/v1/admin/datasets/nope/budget", headers=sqlite_env.admin)
    assert r.status_code == 404 and set(r.json()["error"]) == {"code", "message", "details"}


def test_create_and_list_datasets_with_separate_budgets(env: Env) -> None:
    body = {"name": "jokes", "rating_min": -10, "rating_max": 10, "epsilon_cap": 3.0, "delta": 1e-7,
            "description": "continuous ratings"}
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json=body)
    assert r.status_code == 201, r.text
    assert r.json()["budget"]["epsilon_cap"] == 3.0 and r.json()["budget"]["delta"] == 1e-7
    assert env.client.post("/v1/admin/datasets", headers=env.admin, json=body).status_code == 409
    for bad in ({**body, "name": "x", "rating_min": 5, "rating_max": 5}, {**body, "name": "y", "epsilon_cap": 0},
                {**body, "name": "bad name"}, {**body, "name": "z", "delta": 1.5}):
        assert env.client.post("/v1/admin/datasets", headers=env.admin, json=bad).status_code == 422
    assert env.client.post("/v1/admin/datasets", headers=env.auth("u0"), json=body).status_code == 403
    names = [d["name"] for d in env.client.get("/v1/admin/datasets", headers=env.admin).json()["items"]]
    assert names == ["default", "jokes"]
    # the new data set has its own range: -7.5 is valid there, not in "default"
    env.client.put("/v1/datasets/jokes/items/j1", headers=env.admin, json={"title": "joke"})
    env.client.put("/v1/datasets/default/items/j1", headers=env.admin, json={"title": "joke"})
    assert env.client.put("/v1/datasets/jokes/users/a/ratings/j1", json={"rating": -7.5},
                          headers=env.auth("a")).status_code == 201
    assert env.client.put("/v1/datasets/default/users/a/ratings/j1", json={"rating": -7.5},
                          headers=env.auth("a")).status_code == 422


def test_a_dpfw_training_is_accepted_and_charged_like_any_run(env: Env) -> None:
    seed_ratings(env)
    body = {"algorithm": "dpfw", "epsilon": 1.0, "hyperparameters": {"n_steps": 3, "max_ratings_per_user": 10}}
    r = env.client.post(f"{A}/trainings", headers=env.admin, json=body)
    assert r.status_code == 202, r.text
    run = env.client.get(f"/v1/admin/trainings/{r.json()['run_id']}", headers=env.admin).json()
    assert run["algorithm"] == "dpfw" and run["requested_epsilon"] == 1.0
    entries = env.client.get(f"{A}/ledger", headers=env.admin).json()["items"]
    reservation = [e for e in entries if e["kind"] == "reservation"][-1]
    assert reservation["parameters"]["algorithm"] == "dpfw" and reservation["epsilon"] <= 1.0 + 1e-9
    bad = {**body, "hyperparameters": {"rating_range": [1, 5]}}
    assert env.client.post(f"{A}/trainings", headers=env.admin, json=bad).status_code == 422


def test_declared_kind_and_public_user_bound(env: Env) -> None:
    """kind and max_users are admin declarations (public); delta above 1/(10 max_users) is warned
    about; one-bit runs default user_rows to max_users; bad values are 422 and change nothing."""
    body = {"name": "thumbs", "rating_min": -1, "rating_max": 1, "epsilon_cap": 3.0, "delta": 1e-3,
            "kind": "votes", "max_users": 500}
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json=body)
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["kind"] == "votes" and out["max_users"] == 500
    assert len(out["warnings"]) == 1 and "1/(10 max_users)" in out["warnings"][0]
    for bad in ({"max_users": 0}, {"max_users": 2.5}, {"kind": "clicks"}, {"unknown": 1}):
        assert env.client.patch("/v1/admin/datasets/thumbs", headers=env.admin, json=bad).status_code == 422
    assert env.client.patch("/v1/admin/datasets/thumbs", headers=env.auth("u0"), json={"max_users": 5}).status_code == 403
    r = env.client.patch("/v1/admin/datasets/thumbs", headers=env.admin, json={"max_users": 50})
    assert r.status_code == 200 and r.json()["max_users"] == 50 and r.json()["warnings"] == []
    assert r.json()["kind"] == "votes"  # untouched
    for k in range(6):
        env.client.put(f"/v1/datasets/thumbs/items/t{k}", headers=env.admin, json={"title": f"t{k}"})
    r = env.client.post("/v1/admin/datasets/thumbs/trainings", headers=env.admin,
                        json={"algorithm": "onebit", "epsilon": 1.0, "hyperparameters": {"mechanism": "grap"}})
    assert r.status_code == 202, r.text
    run = env.client.get(f"/v1/admin/trainings/{r.json()['run_id']}", headers=env.admin).json()
    assert run["config"]["user_rows"] == 50  # the declared bound, add/remove-one-user relation
    r = env.client.patch("/v1/admin/datasets/thumbs", headers=env.admin, json={"max_users": None})
    assert r.status_code == 200 and r.json()["max_users"] is None
    assert env.client.patch("/v1/admin/datasets/nope", headers=env.admin, json={"max_users": 5}).status_code == 404


def test_relations_and_person_budgets_over_http(env: Env) -> None:
    """A data set declares its relation and person budget at creation; both show in the budget view."""
    body = {"name": "votes", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": 5.0, "delta": 1e-6,
            "neighbouring_relation": "replace_vote_values"}
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json=body)  # `all` is add/remove
    assert r.status_code == 409 and r.json()["error"]["code"] == "relation_not_implied"
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={**body, "person_budget": "nope"})
    assert r.status_code == 422 and "unknown person budget" in r.json()["error"]["message"]
    for bad in ({"epsilon_cap": -1}, {"epsilon_cap": 1, "neighbouring_relation": "add_remove_one_user"},
                {"epsilon_cap": 1, "delta": 1.5}, {"epsilon_cap": 1, "extra": 1}):
        assert env.client.put("/v1/admin/person-budgets/weak", headers=env.admin, json=bad).status_code == 422
    assert env.client.put("/v1/admin/person-budgets/weak", headers=env.admin, json={"epsilon_cap": 1}).status_code == 422
    r = env.client.put("/v1/admin/person-budgets/weak", headers=env.auth("bob"), json={"epsilon_cap": 1})
    assert r.status_code in (401, 403)
    r = env.client.put("/v1/admin/person-budgets/weak", headers=env.admin,
                       json={"epsilon_cap": 5.0, "delta": 1e-6, "neighbouring_relation": "replace_vote_values"})
    assert r.status_code == 200 and r.json()["neighbouring_relation"] == "replace_vote_values"
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={**body, "person_budget": "weak"})
    assert r.status_code == 201, r.text
    out = r.json()["budget"]
    assert out["neighbouring_relation"] == "replace_vote_values"
    assert out["person_budget"]["name"] == "weak" and out["person_budget"]["datasets"] == ["votes"]
    default = env.client.get("/v1/admin/datasets/default/budget", headers=env.admin).json()
    assert default["neighbouring_relation"] == "add_or_remove_one_user" and default["person_budget"]["name"] == "all"
    r = env.client.put("/v1/admin/person-budgets/weak", headers=env.admin, json={"epsilon_cap": 9.0})
    assert r.status_code == 422  # raising needs a reason
    r = env.client.put("/v1/admin/person-budgets/weak", headers=env.admin,
                       json={"epsilon_cap": 5.0, "neighbouring_relation": "add_or_remove_one_user"})
    assert r.status_code == 409  # fixed at creation
    r = env.client.get("/v1/admin/person-budgets/weak", headers=env.admin)
    assert r.status_code == 200 and r.json()["epsilon_cap"] == 5.0 and r.json()["spent_epsilon_rdp"] == 0.0
    assert env.client.get("/v1/admin/person-budgets/none", headers=env.admin).status_code == 404


def test_privacy_blocks_over_http(env: Env) -> None:
    """The blocks of a data set and of its person budget, current period first, paged; the per-period
    user bound is declared and read back."""
    seed_ratings(env)
    train_and_publish(env, epsilon=1.0)
    page = env.client.get(f"{A}/budget/blocks", headers=env.admin, params={"limit": 1}).json()
    assert page["total"] >= 2 and len(page["items"]) == 1
    assert page["items"][0]["cohort"] != "legacy" and page["items"][0]["n_runs"] == 1
    last = env.client.get(f"{A}/budget/blocks", headers=env.admin, params={"offset": page["total"] - 1}).json()
    assert last["items"][-1]["cohort"] == "legacy"
    people = env.client.get("/v1/admin/person-budgets/all/blocks", headers=env.admin).json()
    assert people["total"] == page["total"]
    assert env.client.get(f"{A}/budget/blocks", headers=env.auth("u0")).status_code == 403
    budget = env.client.get(f"{A}/budget", headers=env.admin).json()
    assert budget["n_blocks"] == page["total"] and budget["current_block"] == page["items"][0]["cohort"]
    r = env.client.patch(A, headers=env.admin, json={"max_users_per_period": 500})
    assert r.status_code == 200, r.text
    assert r.json()["max_users_per_period"] == 500


def test_a_cap_above_its_person_budgets_is_warned_about(env: Env) -> None:
    """A data set's cap above its person budget's promises more than it can spend: the data set
    view says so (the person budget `all` has cap 10 by default)."""
    body = {"name": "wide", "rating_min": 1, "rating_max": 5, "epsilon_cap": 20.0, "delta": 1e-6}
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json=body)
    assert r.status_code == 201, r.text
    assert [w for w in r.json()["warnings"] if "person budget 'all'" in w and "binds first" in w], r.json()
    narrow = env.client.post("/v1/admin/datasets", headers=env.admin, json={**body, "name": "narrow", "epsilon_cap": 5.0})
    assert narrow.status_code == 201 and narrow.json()["warnings"] == []
