"""Dashboard session: admin token -> HttpOnly SameSite=Strict cookie; the cookie is no bearer
token and a bearer token is no session; writes need the CSRF value; non-admins are refused."""

from __future__ import annotations

import re

import jwt

from tests.api.conftest import Env


def _sign_in(env: Env) -> str:
    r = env.client.post("/dashboard/session", json={"token": env.token("root", "admin")})
    assert r.status_code == 204, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    return jwt.decode(env.client.cookies.get("privrec_session"), options={"verify_signature": False})["csrf"]


def test_sign_in_and_csrf(sqlite_env: Env) -> None:
    c = sqlite_env.client
    assert "login" in c.get("/dashboard").text
    csrf = _sign_in(sqlite_env)
    page = c.get("/dashboard").text
    assert f'content="{csrf}"' in page and sqlite_env.token("root", "admin") not in page
    chart = c.get("/dashboard/api/datasets/default/summary").json()["chart"]
    assert chart["points"] == 0 and 'class="chart"' in chart["svg"]  # opened, nothing charged: the empty state
    assert c.post("/dashboard/api/datasets/default/trainings", json={"epsilon": 1}).status_code == 403
    assert c.post("/dashboard/api/datasets/default/trainings", json={"epsilon": 1},
                  headers={"X-CSRF-Token": "wrong"}).status_code == 403
    cookie = c.cookies.get("privrec_session")
    # the session cookie is not a bearer token for the API
    assert c.get("/v1/admin/datasets", headers={"Authorization": f"Bearer {cookie}"}).status_code == 401
    assert c.post("/dashboard/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
    c.cookies.clear()
    assert c.get("/dashboard/api/datasets/default/summary").status_code == 401
    # the cookie copied before sign-out opens nothing any more: sign-out revoked the session
    c.cookies.set("privrec_session", cookie, path="/dashboard")
    assert c.get("/dashboard/api/datasets/default/summary").json()["error"]["code"] == "no_session"
    assert "login" in c.get("/dashboard").text
    assert c.post("/dashboard/api/datasets/default/trainings", json={"epsilon": 1},
                  headers={"X-CSRF-Token": csrf}).status_code == 401
    assert sqlite_env.count("revoked_tokens") == 1


def test_pages_send_csp_no_framing_and_no_store(sqlite_env: Env) -> None:
    """Both pages (sign-in and dashboard) allow scripts from the app's own files only (no inline
    script or handler in any template), forbid framing and are never cached; so is the page's JSON."""
    from pathlib import Path

    c = sqlite_env.client

    def check(r) -> None:  # type: ignore[no-untyped-def]
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["cache-control"] == "no-store" and r.headers["x-frame-options"] == "DENY"

    check(c.get("/dashboard"))
    _sign_in(sqlite_env)
    page = c.get("/dashboard")
    assert 'id="budget"' in page.text
    check(page)
    assert c.get("/dashboard/api/datasets/default/summary").headers["cache-control"] == "no-store"
    assert c.get("/dashboard/static/dashboard.js").status_code == 200
    templates = Path(__file__).resolve().parents[2] / "app" / "templates"
    for html in templates.glob("*.html"):
        text = html.read_text(encoding="utf-8").lower()
        assert not re.search(r"<script(?![^>]*\ssrc=)", text), html  # every script is a served file
        assert not re.search(r"\son[a-z]+\s*=", text) and "javascript:" not in text, html  # no inline handler


def test_non_admin_and_bad_tokens_get_no_session(sqlite_env: Env) -> None:
    c = sqlite_env.client
    assert c.post("/dashboard/session", json={"token": sqlite_env.token("alice")}).status_code == 403
    assert c.post("/dashboard/session", json={"token": "nope"}).status_code == 401
    assert "set-cookie" not in c.post("/dashboard/session", json={"token": "nope"}).headers
    # a bearer token in the cookie is no session
    c.cookies.set("privrec_session", sqlite_env.token("root", "admin"), path="/dashboard")
    assert c.get("/dashboard/api/datasets/default/summary").status_code == 401


def test_dashboard_json_is_typed(sqlite_env: Env) -> None:
    """Every JSON the page reads is one of the declared response models (no ad-hoc dicts)."""
    from app.schemas.admin import DashboardSummaryOut, LedgerEntryOut, ModelVersionOut, TrainingRunOut
    from app.schemas.common import Page

    c = sqlite_env.client
    _sign_in(sqlite_env)
    summary = c.get("/dashboard/api/datasets/default/summary", params={"epsilon": 1.0}).json()
    assert DashboardSummaryOut.model_validate(summary).chain.ok
    for path, model in (("trainings", TrainingRunOut), ("models", ModelVersionOut), ("ledger", LedgerEntryOut)):
        body = c.get(f"/dashboard/api/datasets/default/{path}", params={"limit": 1}).json()
        page = Page[model].model_validate(body)  # type: ignore[valid-type]  # model is a class bound per case
        assert set(body) == {"items", "total", "offset", "limit", "next_offset"}, path
        assert page.next_offset == (1 if page.total > 1 else None), path


def test_summary_shows_every_cap_like_the_admin_api(sqlite_env: Env) -> None:
    """The page's budget and projection compose the data set's cap and its person budget's exactly
    as the admin API does, and name the cap that binds (here the person budget, set below the data set's)."""
    c = sqlite_env.client
    admin = {"Authorization": f"Bearer {sqlite_env.token('root', 'admin')}"}
    budget = c.get("/v1/admin/datasets/default/budget", headers=admin).json()
    lowered = c.put("/v1/admin/person-budgets/all", headers=admin,
                    json={"epsilon_cap": budget["epsilon_cap"] / 2})
    assert lowered.status_code == 200, lowered.text
    budget = c.get("/v1/admin/datasets/default/budget", headers=admin).json()
    projection = c.get("/v1/admin/datasets/default/budget/projection", headers=admin, params={"epsilon": 1.0}).json()
    assert budget["binding_cap"] == projection["binding_cap"] == "person_budget"
    _sign_in(sqlite_env)
    summary = c.get("/dashboard/api/datasets/default/summary", params={"epsilon": 1.0}).json()
    shown, planned = summary["budget"], summary["projection"]
    for key in ("remaining_epsilon", "dataset_remaining_epsilon", "binding_cap", "person_budget"):
        assert shown[key] == budget[key], key
    for key in ("affordable_runs", "affordable_runs_capped", "binding_cap", "person_budget",
                "person_epsilon_cap", "person_spent_epsilon_rdp", "person_composed_epsilon_rdp"):
        assert planned[key] == projection[key], key
    page = c.get("/dashboard", params={"dataset": "default"}).text
    for element in ("remaining", "binding-cap", "dataset-remaining", "person-remaining", "affordable",
                    "projection-binding"):
        assert f'id="{element}"' in page, element
