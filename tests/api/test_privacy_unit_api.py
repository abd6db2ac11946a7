"""The privacy unit over HTTP: declared at creation, fixed afterwards (clear codes), shown beside
every budget number, one unit per person budget, refused for votes."""

from __future__ import annotations

from tests.api.conftest import Env

_BODY = {"name": "periodic", "rating_min": 1.0, "rating_max": 5.0, "epsilon_cap": 5.0, "delta": 1e-6,
         "privacy_unit": "user_period"}


def _code(r) -> str:
    return r.json()["error"]["code"]


def _periodic(env: Env) -> dict:
    r = env.client.put("/v1/admin/person-budgets/periods", headers=env.admin,
                       json={"epsilon_cap": 5.0, "delta": 1e-6, "privacy_unit": "user_period"})
    assert r.status_code == 200, r.text
    assert (r.json()["privacy_unit"], r.json()["privacy_unit_label"]) == ("user_period", "per user per period")
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json={**_BODY, "person_budget": "periods"})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_data_set_declares_its_unit_and_every_budget_number_names_it(env: Env) -> None:
    r = env.client.post("/v1/admin/datasets", headers=env.admin, json=_BODY)  # `all` is user-level
    assert r.status_code == 409 and _code(r) == "privacy_unit_mismatch"
    out = _periodic(env)
    assert out["privacy_unit"] == "user_period"
    assert (out["budget"]["privacy_unit"], out["budget"]["privacy_unit_label"]) == ("user_period", "per user per period")
    assert out["budget"]["person_budget"]["privacy_unit"] == "user_period"
    ds = "/v1/admin/datasets/periodic"
    assert env.client.get(f"{ds}/budget", headers=env.admin).json()["privacy_unit_label"] == "per user per period"
    blocks = env.client.get(f"{ds}/budget/blocks", headers=env.admin).json()
    assert all(b["privacy_unit_label"] == "per user per period" for b in blocks["items"])
    projection = env.client.get(f"{ds}/budget/projection", headers=env.admin, params={"epsilon": 1.0}).json()
    assert projection["privacy_unit"] == "user_period"
    default = env.client.get("/v1/admin/datasets/default/budget", headers=env.admin).json()
    assert (default["privacy_unit"], default["privacy_unit_label"]) == ("user", "per user")
    r = env.client.post("/v1/admin/datasets", headers=env.admin,
                        json={**_BODY, "name": "plain", "privacy_unit": "user", "person_budget": "periods"})
    assert r.status_code == 409 and _code(r) == "privacy_unit_mismatch"


def test_the_unit_never_changes(env: Env) -> None:
    _periodic(env)
    ds = "/v1/admin/datasets/periodic"
    r = env.client.patch(ds, headers=env.admin, json={"privacy_unit": "user"})
    assert r.status_code == 409 and _code(r) == "privacy_unit_fixed"
    r = env.client.patch(ds, headers=env.admin, json={"privacy_unit": "user_period", "max_users": 50})
    assert r.status_code == 200 and r.json()["privacy_unit"] == "user_period" and r.json()["max_users"] == 50
    r = env.client.patch("/v1/admin/datasets/default", headers=env.admin, json={"privacy_unit": "user_period"})
    assert r.status_code == 409 and _code(r) == "privacy_unit_fixed"
    r = env.client.put("/v1/admin/person-budgets/periods", headers=env.admin,
                       json={"epsilon_cap": 5.0, "privacy_unit": "user"})
    assert r.status_code == 409 and _code(r) == "person_budget_fixed"
    r = env.client.patch(ds, headers=env.admin, json={"privacy_unit": "user_hour"})
    assert r.status_code == 422
    assert env.client.get(f"{ds}/budget", headers=env.admin).json()["privacy_unit"] == "user_period"


def test_votes_are_refused_the_user_period_unit(env: Env) -> None:
    _periodic(env)
    r = env.client.post("/v1/admin/datasets", headers=env.admin,
                        json={**_BODY, "name": "thumbs", "kind": "votes", "person_budget": "periods"})
    assert r.status_code == 422 and _code(r) == "privacy_unit_not_supported"
    ds = "/v1/admin/datasets/periodic"
    r = env.client.patch(ds, headers=env.admin, json={"kind": "votes"})
    assert r.status_code == 422 and _code(r) == "privacy_unit_not_supported"
    r = env.client.put(f"{ds}/vote-settings", headers=env.admin, json={"local_epsilon": 1.0, "votes_per_user_cap": 5})
    assert r.status_code == 422 and _code(r) == "privacy_unit_not_supported"
    r = env.client.post(f"{ds}/trainings", headers=env.admin, json={"algorithm": "onebit", "epsilon": 1.0})
    assert r.status_code == 422 and _code(r) == "privacy_unit_not_supported"
    assert env.client.get(f"{ds}/ledger", headers=env.admin).json()["total"] == 1  # nothing charged
