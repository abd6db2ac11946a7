"""The recommendation fast path answers exactly as the route does, and leaves every other request
(and every request it would refuse) to the app."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api import fast_path
from app.api.fast_path import RecommendationFastPath, plain_request
from app.main import create_app
from tests.api.conftest import Env, seed_ratings, train_and_publish

R = "/v1/datasets/default"
TOKEN = "header.payload.signature"


class _App:
    dependency_overrides: dict = {}


def _scope(path: str = f"{R}/users/u0/recommendations", query: bytes = b"n=5", method: str = "GET",
           headers: list[tuple[bytes, bytes]] | None = None, **extra: Any) -> dict:
    if headers is None:
        headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {TOKEN}".encode())]
    return {"type": "http", "method": method, "path": path, "query_string": query, "root_path": "",
            "headers": headers, "app": _App(), **extra}


def test_plain_requests_are_recognised() -> None:
    assert plain_request(_scope()) == ("default", "u0", 5, TOKEN)
    assert plain_request(_scope(query=b"")) == ("default", "u0", 10, TOKEN)
    assert plain_request(_scope(query=b"n=1000")) == ("default", "u0", 1000, TOKEN)
    assert plain_request(_scope(headers=[(b"authorization", f"bearer  {TOKEN} ".encode())])) == (
        "default", "u0", 5, TOKEN)
    user = "a.b:c@d-e_" + "x" * 118
    assert plain_request(_scope(path=f"/v1/datasets/d-1_x/users/{user}/recommendations")) == ("d-1_x", user, 5, TOKEN)


@pytest.mark.parametrize("scope", [
    _scope(method="HEAD"), _scope(method="POST"),
    _scope(query=b"n=0"), _scope(query=b"n=1001"), _scope(query=b"n=05"), _scope(query=b"n=+5"),
    _scope(query=b"n=5&n=6"), _scope(query=b"n=5&category=a"), _scope(query=b"exclude=i1"), _scope(query=b"n="),
    _scope(query=b"n=%35"), _scope(query=b"m=5"),
    _scope(path=f"{R}/users/u0/recommendations/"), _scope(path=f"{R}/users/u0/recommendations\n"),
    _scope(path=f"{R}/users/u 0/recommendations"), _scope(path=f"{R}/users/{'x' * 129}/recommendations"),
    _scope(path=f"/v1/datasets/{'d' * 65}/users/u0/recommendations"), _scope(path="/v1/datasets/d.x/users/u0/recommendations"),
    _scope(path=f"{R}/users//recommendations"), _scope(path="/v2/datasets/default/users/u0/recommendations"),
    _scope(headers=[]), _scope(headers=[(b"authorization", b"Basic dTpw")]), _scope(headers=[(b"authorization", b"Bearer ")]),
    _scope(headers=[(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]),
    _scope(root_path="/api"),
], ids=lambda s: f"{s['method']} {s['path'][-24:]!r} {s['query_string']!r} {s['headers'][-1:]!r} {s['root_path']!r}")
def test_anything_else_is_left_to_the_app(scope: dict) -> None:
    assert plain_request(scope) is None


def test_dependency_overrides_leave_everything_to_the_app() -> None:
    scope = _scope()
    scope["app"] = type("Overridden", (), {"dependency_overrides": {object(): object()}})()
    assert plain_request(scope) is None


@pytest.fixture
def published(env: Env) -> Env:
    seed_ratings(env)
    train_and_publish(env)
    return env


@pytest.fixture
def route_only(env: Env) -> Iterator[TestClient]:
    """The same app on the same database without the fast path: every request takes the route."""
    app = create_app(env.settings)
    app.user_middleware = [m for m in app.user_middleware if m.cls is not RecommendationFastPath]
    with TestClient(app) as client:
        yield client


@pytest.fixture
def shortcut_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Tokens the fast path verified (the route verifies through its own dependency)."""
    calls: list[str] = []
    verify = fast_path.verify_bearer

    def counting(settings: Any, token: str) -> Any:
        calls.append(token)
        return verify(settings, token)

    monkeypatch.setattr(fast_path, "verify_bearer", counting)
    return calls


def _same(a: Any, b: Any) -> None:
    assert a.status_code == b.status_code
    assert a.content == b.content
    assert {k: v for k, v in a.headers.items() if k != "x-request-id"} == {
        k: v for k, v in b.headers.items() if k != "x-request-id"}


@pytest.mark.parametrize("query", ["", "?n=1", "?n=7", "?n=1000"])
def test_fast_path_answers_exactly_as_the_route(published: Env, route_only: TestClient, shortcut_calls: list[str],
                                                query: str) -> None:
    env = published
    for user in ("u0", "u3", "someone-new"):
        headers = env.auth(user)
        fast = env.client.get(f"{R}/users/{user}/recommendations{query}", headers=headers)
        assert fast.status_code == 200, fast.text
        _same(fast, route_only.get(f"{R}/users/{user}/recommendations{query}", headers=headers))
    assert len(shortcut_calls) == 3
    service = env.auth("svc", "service", ("act_for_users",))
    _same(env.client.get(f"{R}/users/u0/recommendations{query}", headers=service),
          route_only.get(f"{R}/users/u0/recommendations{query}", headers=service))
    assert len(shortcut_calls) == 4


def test_refusals_and_invalid_requests_keep_the_apps_answers(published: Env, route_only: TestClient,
                                                            shortcut_calls: list[str]) -> None:
    env = published
    cases = [
        ("u0", "?n=5", env.auth("u1")),  # 403 wrong_subject
        ("u0", "?n=5", env.admin),  # 403: admins do not read users' data
        ("u0", "?n=5", {"Authorization": "Bearer not-a-token"}),  # 401 invalid_token
        ("u0", "?n=5", {}),  # 401 missing_token
        ("u0", "?n=0", env.auth("u0")),  # 422
        ("u0", "?n=abc", env.auth("u0")),  # 422
        ("u 0", "?n=5", env.auth("u 0")),  # 422 (pattern)
    ]
    for user, query, headers in cases:
        fast = env.client.get(f"{R}/users/{user}/recommendations{query}", headers=headers)
        assert fast.status_code in (401, 403, 422), fast.text
        _same(fast, route_only.get(f"{R}/users/{user}/recommendations{query}", headers=headers))


def test_service_errors_go_through_the_apps_handlers(env: Env, route_only: TestClient,
                                                     shortcut_calls: list[str]) -> None:
    for dataset in ("default", "nope"):  # 404 no_active_model, 404 unknown_dataset
        path = f"/v1/datasets/{dataset}/users/u0/recommendations?n=3"
        fast = env.client.get(path, headers=env.auth("u0"))
        assert fast.status_code == 404, fast.text
        _same(fast, route_only.get(path, headers=env.auth("u0")))
    assert len(shortcut_calls) == 2


def test_fast_path_requests_are_counted_under_the_route_template(published: Env, shortcut_calls: list[str]) -> None:
    env = published
    assert env.client.get(f"{R}/users/u0/recommendations?n=3", headers=env.auth("u0")).status_code == 200
    assert shortcut_calls
    metrics = env.client.get("/metrics", headers=env.admin).text
    assert 'route="/v1/datasets/{dataset}/users/{user_id}/recommendations"' in metrics
