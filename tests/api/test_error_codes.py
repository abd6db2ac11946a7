"""One code per condition: every API code is documented in openapi.yaml (per route and status) and in
the README table, and representative routes return the code they document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.api.contract import error_table_markdown
from app.errors import ERROR_CODES
from tests.api.conftest import Env

ROOT = Path(__file__).resolve().parents[2]

BODIES: dict[tuple[str, str], Any] = {
    ("put", "/v1/datasets/{dataset}/users/{user_id}/ratings/{item_id}"): {"rating": 3},
    ("post", "/v1/datasets/{dataset}/ratings/batch"): {"ratings": [{"user_id": "u1", "item_id": "i1", "rating": 3}]},
    ("put", "/v1/datasets/{dataset}/items/{item_id}"): {"title": "t"},
    ("post", "/v1/datasets/{dataset}/users/{user_id}/recommendations"): {},
    ("put", "/v1/datasets/{dataset}/users/{user_id}/votes/{item_id}"): {"vote": 1},
    ("post", "/v1/datasets/{dataset}/votes/batch"): {"votes": [{"user_id": "u1", "item_id": "i1", "vote": 1}]},
    ("put", "/v1/datasets/{dataset}/users/{user_id}/public-ratings"): {"public": True},
    ("put", "/v1/admin/datasets/{dataset}/vote-settings"): {"local_epsilon": None, "votes_per_user_cap": None},
    ("put", "/v1/admin/datasets/{dataset}/retrain-policy"): {"epsilon": 0.5},
    ("put", "/v1/admin/datasets/{dataset}/similarity-sources/{source}"): {"provenance": "https://example.org",
                                                                          "declared_public": True},
    ("post", "/v1/admin/datasets/{dataset}/similarity-sources/{source}/neighbours"): {
        "rows": [{"item_id": "i1", "neighbours": []}]},
    ("patch", "/v1/admin/datasets/{dataset}"): {"kind": "ratings"},
    ("patch", "/v1/admin/datasets/{dataset}/budget"): {"epsilon_cap": 5.0, "reason": "test"},
    ("post", "/v1/admin/datasets/{dataset}/trainings"): {"epsilon": 1.0},
}
"""A valid body for every route with one (they differ only in naming an unknown data set)."""

QUERIES = {("get", "/v1/admin/datasets/{dataset}/budget/projection"): {"epsilon": 1.0}}


def _documented(doc: dict[str, Any]) -> dict[str, set[int]]:
    """code -> the HTTP statuses under which some operation lists it."""
    out: dict[str, set[int]] = {}
    for ops in doc["paths"].values():
        for op in ops.values():
            for status, response in op["responses"].items():
                for code in response.get("x-error-codes", []):
                    out.setdefault(code, set()).add(int(status))
    return out


def test_every_api_code_is_documented_under_its_status(sqlite_env: Env) -> None:
    documented = _documented(sqlite_env.client.get("/openapi.json").json())
    for code, error in ERROR_CODES.items():
        if error.where == "api":
            assert documented.get(code) == {error.status_code}, code
    assert set(documented) <= set(ERROR_CODES), set(documented) - set(ERROR_CODES)
    assert all(ERROR_CODES[code].where == "api" for code in documented)


def test_one_code_per_condition() -> None:
    """A code names one class, hence one status; request validation has the one code."""
    assert len({error for error in ERROR_CODES.values()}) == len(ERROR_CODES)
    assert [code for code, error in ERROR_CODES.items() if error.__name__ == "ValidationFailed"] == ["validation_error"]


def test_readme_table_lists_every_code() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert error_table_markdown() in readme, "README's error-code table is stale: paste error_table_markdown()"


def _dataset_routes(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method, path) for path, ops in doc["paths"].items() if "{dataset}" in path for method in ops]


def _headers(env: Env, path: str) -> dict[str, str]:
    return env.admin if path.startswith("/v1/admin/") or path.endswith("/items/{item_id}") else env.auth("u1")


def test_unknown_dataset_is_unknown_dataset_on_every_dataset_route(sqlite_env: Env) -> None:
    doc = sqlite_env.client.get("/openapi.json").json()
    routes = _dataset_routes(doc)
    assert len(routes) >= 35
    params = {"dataset": "nope", "user_id": "u1", "item_id": "i1", "source": "src", "version_id": "1"}
    for method, template in routes:
        kwargs: dict[str, Any] = {"headers": _headers(sqlite_env, template),
                                  "params": QUERIES.get((method, template), {})}
        if "requestBody" in doc["paths"][template][method]:
            kwargs["json"] = BODIES[method, template]
        r = sqlite_env.client.request(method.upper(), template.format(**params), **kwargs)
        assert r.status_code == 404, (method, template, r.text)
        assert r.json()["error"]["code"] == "unknown_dataset", (method, template, r.text)


@pytest.mark.parametrize("method, path, kwargs", [
    ("GET", "/v1/datasets/default/items?limit=0", {}),
    ("GET", "/v1/datasets/default/items/i1/similar?n=0", {}),
    ("PUT", "/v1/datasets/default/users/u1/ratings/i1", {"json": {"rating": "high"}}),
    ("POST", "/v1/admin/datasets", {"json": {"name": "bad name", "rating_min": 1, "rating_max": 5,
                                             "epsilon_cap": 1.0, "delta": 1e-6}}),
    ("GET", "/v1/admin/trainings/0", {}),
    ("POST", "/v1/admin/datasets/default/trainings", {"json": {"epsilon": 1.0, "unknown": 1}}),
])
def test_request_validation_is_validation_error(sqlite_env: Env, method: str, path: str,
                                                 kwargs: dict[str, Any]) -> None:
    r = sqlite_env.client.request(method, path, headers=sqlite_env.admin if "/admin/" in path else sqlite_env.auth("u1"),
                                  **kwargs)
    assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", r.text


def test_domain_conditions_return_their_documented_code(sqlite_env: Env) -> None:
    """A few domain refusals: the code returned is the one the route documents under that status."""
    doc = sqlite_env.client.get("/openapi.json").json()
    c, admin = sqlite_env.client, sqlite_env.admin
    cases = [
        ("get", "/v1/admin/trainings/{run_id}", c.get("/v1/admin/trainings/424242", headers=admin)),
        ("get", "/v1/admin/person-budgets/{name}", c.get("/v1/admin/person-budgets/nobody", headers=admin)),
        ("get", "/v1/datasets/{dataset}/model", c.get("/v1/datasets/default/model")),
        ("get", "/v1/datasets/{dataset}/items/{item_id}", c.get("/v1/datasets/default/items/none")),
        ("post", "/v1/admin/datasets/{dataset}/trainings",
         c.post("/v1/admin/datasets/default/trainings", headers=admin, json={"algorithm": "nope", "epsilon": 1.0})),
        ("get", "/v1/datasets/{dataset}/users/{user_id}/ratings",
         c.get("/v1/datasets/default/users/u2/ratings", headers=sqlite_env.auth("u1"))),
        ("get", "/v1/admin/datasets", c.get("/v1/admin/datasets", headers=sqlite_env.auth("u1"))),
        ("get", "/v1/admin/datasets", c.get("/v1/admin/datasets")),
    ]
    expected = ["unknown_training_run", "unknown_person_budget", "no_active_model", "unknown_item",
                "unknown_algorithm", "wrong_subject", "admin_required", "missing_token"]
    for (method, template, r), code in zip(cases, expected, strict=True):
        assert r.json()["error"]["code"] == code, (template, r.text)
        assert code in doc["paths"][template][method]["responses"][str(r.status_code)]["x-error-codes"], template
