"""The budget projection: a run at eps composes to y (not spent + eps) and k runs are affordable,
checked against the ledger's behaviour on real training requests."""

from __future__ import annotations

from tests.api.conftest import SMALL_DPALS, Env, add_items, seed_ratings, train_and_publish


def _project(env: Env, eps: float) -> dict:
    r = env.client.get(f"/v1/admin/datasets/default/budget/projection?epsilon={eps}", headers=env.admin)
    assert r.status_code == 200, r.text
    return r.json()


def test_projection_matches_what_the_ledger_then_charges(env: Env) -> None:
    seed_ratings(env)
    train_and_publish(env, epsilon=2.0)
    p = _project(env, 2.0)
    assert p["algorithm"] == "dpals" and p["hyperparameters"]["rank"] == SMALL_DPALS["rank"]
    assert p["composed_epsilon_rdp"] < p["spent_epsilon_rdp"] + 2.0  # composition is sub-additive here
    assert p["composed_epsilon_pld"] <= p["composed_epsilon_rdp"] + 1e-6
    k = p["affordable_runs"]
    assert k is not None and k >= 1 and p["fits"]
    statuses = []
    for n in range(k + 1):  # each a new run (its own key: a keyless repeat would be a blind retry)
        r = env.client.post("/v1/admin/datasets/default/trainings", headers=env.admin,
                            json={"epsilon": 2.0, "hyperparameters": p["hyperparameters"], "idempotency_key": f"run-{n}"})
        statuses.append(r.status_code)
        if len(statuses) == 1:
            budget = env.client.get("/v1/admin/datasets/default/budget", headers=env.admin).json()
            assert abs(budget["spent_epsilon_rdp"] - p["composed_epsilon_rdp"]) <= 1e-6
    assert statuses == [202] * k + [409]
    assert _project(env, 2.0)["affordable_runs"] == 0 and not _project(env, 2.0)["fits"]


def test_projection_refuses_bad_epsilon_and_unknown_data_set(sqlite_env: Env) -> None:
    c, h = sqlite_env.client, sqlite_env.admin
    assert c.get("/v1/admin/datasets/default/budget/projection?epsilon=0", headers=h).status_code == 422
    assert c.get("/v1/admin/datasets/default/budget/projection?epsilon=1e300", headers=h).status_code == 422
    assert c.get("/v1/admin/datasets/nope/budget/projection?epsilon=1", headers=h).status_code == 404
    assert c.get("/v1/admin/datasets/default/budget/projection?epsilon=1").status_code == 401


def test_projection_on_a_weaker_account_is_the_converted_charge(env: Env) -> None:
    """On a replace-one-user data set an add/remove run is charged by group privacy (about 2ε):
    the projection must say so, and equal what the reservation then charges."""
    c, h = env.client, env.admin
    assert c.put("/v1/admin/person-budgets/weak", headers=h,
                 json={"epsilon_cap": 50.0, "delta": 1e-6, "neighbouring_relation": "replace_one_user"}).status_code == 200
    r = c.post("/v1/admin/datasets", headers=h, json={
        "name": "weak", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": 50.0, "delta": 1e-6,
        "neighbouring_relation": "replace_one_user", "person_budget": "weak"})
    assert r.status_code == 201, r.text
    add_items(env, 5, dataset="weak")
    p = c.get("/v1/admin/datasets/weak/budget/projection?epsilon=1", headers=h).json()
    assert p["run_epsilon_rdp"] > 1.5  # not the add/remove figure (≈ 1)
    r = c.post("/v1/admin/datasets/weak/trainings", headers=h, json={"epsilon": 1.0})
    assert r.status_code == 202, r.text
    budget = c.get("/v1/admin/datasets/weak/budget", headers=h).json()
    assert abs(budget["spent_epsilon_rdp"] - p["composed_epsilon_rdp"]) <= 1e-6
    run = c.get(f"/v1/admin/trainings/{r.json()['run_id']}", headers=h).json()
    assert abs(run["epsilon_charged"] - p["run_epsilon_rdp"]) <= 1e-6  # the run's ε names the account's relation


def test_projection_names_the_person_budget_when_it_binds_and_the_ledger_honours_its_count(env: Env) -> None:
    """A data set with a larger cap than its person budget: the projection, `remaining_epsilon` and
    the affordable count compose both caps, name the person budget as binding, and the ledger then
    accepts exactly that many runs."""
    c, h = env.client, env.admin
    assert c.put("/v1/admin/person-budgets/small", headers=h,
                 json={"epsilon_cap": 3.0, "delta": 1e-6}).status_code == 200
    r = c.post("/v1/admin/datasets", headers=h, json={
        "name": "big", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": 50.0, "delta": 1e-6,
        "person_budget": "small"})
    assert r.status_code == 201, r.text
    add_items(env, 5, dataset="big")
    p = c.get("/v1/admin/datasets/big/budget/projection?epsilon=1", headers=h).json()
    assert p["binding_cap"] == "person_budget" and p["person_budget"] == "small"
    assert p["person_epsilon_cap"] == 3.0 and p["epsilon_cap"] == 50.0
    k = p["affordable_runs"]
    assert k is not None and 1 <= k < 10 and not p["affordable_runs_capped"] and p["fits"]
    b = c.get("/v1/admin/datasets/big/budget", headers=h).json()
    assert b["binding_cap"] == "person_budget" and b["remaining_epsilon"] == b["person_budget"]["remaining_epsilon"]
    assert b["dataset_remaining_epsilon"] == 50.0
    statuses = [c.post("/v1/admin/datasets/big/trainings", headers=h,  # new runs: each its own key
                       json={"epsilon": 1.0, "idempotency_key": f"run-{n}"}).status_code
                for n in range(k + 1)]
    assert statuses == [202] * k + [409]
    after = c.get("/v1/admin/datasets/big/budget/projection?epsilon=1", headers=h).json()
    assert after["affordable_runs"] == 0 and not after["fits"] and after["binding_cap"] == "person_budget"
    assert after["composed_epsilon_rdp"] <= 50.0 < after["epsilon_cap"] + 1  # the data set's own cap still fits
