"""The admin dashboard (``/dashboard``): server-rendered HTML, one hand-written JS file and a
server-rendered SVG chart (:mod:`app.api.spend_chart`); no build step.

Sign-in exchanges an admin bearer token (sent once in a JSON body, never in a URL) for a session
cookie: a JWT with audience ``privrec-dashboard`` (so it is no bearer token, and no bearer token
is a session), ``HttpOnly``, ``SameSite=Strict``, carrying a random CSRF value that the page
echoes in ``X-CSRF-Token`` on every write, and an id (``jti``) that sign-out revokes. The pages
are sent with a Content-Security-Policy that allows only the app's own script and style files,
no framing and no caching. The JSON routes under ``/dashboard/api`` call the same services as the
admin API; nothing here reads private data beyond what the admin API shows.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import jwt
from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from app.api.deps import (
    SessionDep,
    SettingsDep,
    WriteSessionDep,
    page_query,
    refuse_revoked,
    revocation_list,
    verify_bearer,
)
from app.api.params import DatasetP
from app.api.spend_chart import chart_svg
from app.auth import ISSUER
from app.config import Settings
from app.core.algorithms import ALGORITHMS
from app.errors import AdminRequired, CsrfFailed, InvalidToken, NoSession, TokenRevoked, Unauthorized
from app.schemas.admin import (
    MAX_EPSILON_CAP,
    BlockOut,
    BudgetOut,
    ChartOut,
    DashboardSummaryOut,
    DashboardTrainingOut,
    ForecastOut,
    LedgerCheckOut,
    LedgerEntryOut,
    ModelVersionOut,
    Objective,
    ProjectionOut,
    TrainingIn,
    TrainingRunOut,
)
from app.schemas.common import MAX_PAGE_SIZE, Page, PageRequest
from app.services import admin as svc
from app.services import revocations
from app.services.unit_of_work import after_commit

__all__ = ["router", "COOKIE"]

async def _not_cached(response: Response) -> None:
    """Nothing the dashboard sends (budget figures, sessions) is kept by browsers or proxies."""
    response.headers["Cache-Control"] = "no-store"


router = APIRouter(include_in_schema=False, dependencies=[Depends(_not_cached)])
T = TypeVar("T")
templates = Jinja2Templates(directory=str(Path(__file__).resolve().parents[2] / "templates"))

COOKIE = "privrec_session"
AUDIENCE = "privrec-dashboard"
SESSION_TTL_S = 8 * 3600
CHART_POINTS = MAX_PAGE_SIZE  # the chart draws the latest entries up to this many (one page)
DashboardPageQ = Annotated[PageRequest, Depends(page_query(20))]


# ----------------------------------------------------------------------------- session
def _issue_session(subject: str, settings: Settings, expires: int) -> tuple[str, str]:
    csrf = secrets.token_urlsafe(24)
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "iat": now, "exp": expires, "csrf": csrf,
              "jti": uuid.uuid4().hex}
    return jwt.encode(claims, settings.secret_key, algorithm=settings.jwt_algorithm), csrf


def _session_claims(request: Request, settings: Settings) -> dict[str, Any] | None:
    raw = request.cookies.get(COOKIE)
    if not raw:
        return None
    try:
        return jwt.decode(raw, settings.secret_key, algorithms=[settings.jwt_algorithm], audience=AUDIENCE,
                          issuer=ISSUER, options={"require": ["exp", "sub", "csrf", "aud", "jti"]})
    except jwt.InvalidTokenError:
        return None


async def live_session(request: Request, settings: SettingsDep) -> dict[str, Any] | None:
    """The claims of the request's session cookie; None without one, or when it is invalid,
    expired or revoked (signed out)."""
    claims = _session_claims(request, settings)
    if claims is None:
        return None
    try:
        await refuse_revoked(request.app, str(claims["jti"]))
    except TokenRevoked:
        return None
    return claims


LiveSession = Annotated[dict[str, Any] | None, Depends(live_session)]


async def session_admin(claims: LiveSession) -> dict[str, Any]:
    """401 without a valid session cookie."""
    if claims is None:
        raise NoSession("sign in to the dashboard first")
    return claims


SessionAdmin = Annotated[dict[str, Any], Depends(session_admin)]


async def csrf_admin(request: Request, claims: SessionAdmin) -> dict[str, Any]:
    """Writes also need the session's CSRF value in ``X-CSRF-Token`` (403 otherwise)."""
    sent = request.headers.get("x-csrf-token", "")
    if not secrets.compare_digest(sent, str(claims["csrf"])):
        raise CsrfFailed("missing or wrong CSRF token")
    return claims


CsrfAdmin = Annotated[dict[str, Any], Depends(csrf_admin)]


@router.post("/dashboard/session", status_code=204)
async def sign_in(request: Request, settings: SettingsDep,
                  token: Annotated[str, Body(embed=True, max_length=4096)]) -> Response:
    """Exchange an admin bearer token (not revoked) for the session cookie (expires no later than
    the token)."""
    try:
        principal = await verify_bearer(request.app, token)
    except Unauthorized:
        raise InvalidToken("invalid, expired or revoked token") from None
    if not principal.is_admin:
        raise AdminRequired("the dashboard needs an admin token")
    value, _ = _issue_session(principal.subject, settings,
                              min(principal.expires_at, int(time.time()) + SESSION_TTL_S))
    response = Response(status_code=204)
    response.set_cookie(COOKIE, value, httponly=True, samesite="strict", path="/dashboard",
                        secure=not settings.embedded, max_age=SESSION_TTL_S)
    return response


@router.post("/dashboard/logout", status_code=204)
def sign_out(request: Request, claims: CsrfAdmin, session: WriteSessionDep) -> Response:
    """Revoke the session (its cookie, even if copied, opens nothing any more) and drop the cookie."""
    token_id = str(claims["jti"])
    revocations.revoke(session, token_id=token_id, expires_at=int(claims["exp"]),
                       actor=f"admin:{claims['sub']}", reason="dashboard sign-out")
    after_commit(session, partial(revocation_list(request.app).add, token_id))
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path="/dashboard")
    return response


# ----------------------------------------------------------------------------- page
@router.get("/dashboard", response_class=HTMLResponse)
def page(request: Request, claims: LiveSession, session: SessionDep) -> HTMLResponse:
    if claims is None:
        return _no_store(templates.TemplateResponse(request, "login.html", {}))
    names = [d.name for d in svc.datasets_page(session, offset=0, limit=MAX_PAGE_SIZE).items]
    return _no_store(templates.TemplateResponse(request, "dashboard.html", {
        "csrf": claims["csrf"], "subject": claims["sub"], "datasets": names, "algorithms": _algorithm_choices(),
        "dataset": request.query_params.get("dataset") if request.query_params.get("dataset") in names else
        (names[0] if names else None)}))


def _algorithm_choices() -> list[dict[str, Any]]:
    """The start form's algorithms (the request's default first) with the objectives each takes."""
    default = TrainingIn.model_fields["algorithm"].default
    names = sorted(ALGORITHMS, key=lambda n: (n != default, n))
    return [{"name": n, "default": n == default,
             "objectives": list(get_args(Objective)) if ALGORITHMS[n].takes_objective else []} for n in names]


CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""The pages' policy: scripts and styles only from files the app serves (no inline script or
handler), no framing (clickjacking), nothing fetched from elsewhere."""


def _no_store(response: HTMLResponse) -> HTMLResponse:
    """A page with the dashboard's security headers: CSP, no framing, not cached anywhere."""
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


# ----------------------------------------------------------------------------- JSON for the page
@router.get("/dashboard/api/datasets/{dataset}/summary", response_model=DashboardSummaryOut)
def summary(dataset: DatasetP, _: SessionAdmin, session: SessionDep, settings: SettingsDep,
            epsilon: Annotated[float, Query(ge=1e-3, le=MAX_EPSILON_CAP)] = 1.0) -> DashboardSummaryOut:
    """Budget (with the current block's), chain status, projection at ``epsilon``, the spend chart
    and the block forecast."""
    budget = svc.budget_view(session, dataset=dataset)
    projection: ProjectionOut | None = None
    projection_error = None
    try:
        projection = svc.projection(session, dataset=dataset, epsilon=epsilon)
    except Exception as exc:  # noqa: BLE001 - shown on the page (e.g. no algorithm applies yet)
        projection_error = getattr(exc, "message", type(exc).__name__)
    forecast: ForecastOut | None = None
    forecast_error = None
    try:
        forecast = svc.forecast_view(session, dataset=dataset, settings=settings)
    except Exception as exc:  # noqa: BLE001 - shown on the page (e.g. the next run cannot be built)
        forecast_error = getattr(exc, "message", type(exc).__name__)
    return DashboardSummaryOut(
        budget=budget, current_block=_current_block(session, budget),
        chain=LedgerCheckOut.model_validate(svc.chain_status(session, dataset=dataset)),
        projection=projection, projection_error=projection_error,
        chart=_chart(session, budget), forecast=forecast, forecast_error=forecast_error)


def _chart(session: Session, budget: BudgetOut) -> ChartOut:
    """The spend chart over the latest :data:`CHART_POINTS` ledger entries, with the person budget's cap."""
    total = svc.ledger_page(session, dataset=budget.dataset, offset=0, limit=1).total
    entries = [e.model_dump(mode="json") for e in svc.ledger_page(
        session, dataset=budget.dataset, offset=max(0, total - CHART_POINTS), limit=CHART_POINTS).items]
    history = budget.person_budget.history if budget.person_budget else []
    svg, points = chart_svg(entries, history)
    return ChartOut(points=points, svg=svg)


def _current_block(session: Session, budget: BudgetOut) -> BlockOut | None:
    """The block users joining now belong to (None where the data set keeps no blocks); one not
    opened yet has nothing spent."""
    if budget.current_block is None:
        return None
    first = svc.blocks_page(session, dataset=budget.dataset, offset=0, limit=1).items
    if first and first[0].cohort == budget.current_block:
        return first[0]
    return BlockOut(cohort=budget.current_block, epsilon_cap=budget.epsilon_cap, delta=budget.delta,
                    spent_epsilon_rdp=0.0, spent_epsilon_pld=0.0, remaining_epsilon=budget.epsilon_cap, n_runs=0,
                    privacy_unit=budget.privacy_unit, privacy_unit_label=budget.privacy_unit_label)


@router.get("/dashboard/api/datasets/{dataset}/blocks", response_model=Page[BlockOut])
def blocks(dataset: DatasetP, _: SessionAdmin, session: SessionDep, settings: SettingsDep,
           page: DashboardPageQ) -> Page[BlockOut]:
    """The data set's privacy blocks, the current period first, with their forecast (paged)."""
    return svc.blocks_page(session, dataset=dataset, offset=page.offset, limit=page.limit, settings=settings)


@router.get("/dashboard/api/datasets/{dataset}/trainings", response_model=Page[TrainingRunOut])
def trainings(dataset: DatasetP, _: SessionAdmin, session: SessionDep, page: DashboardPageQ) -> Page[TrainingRunOut]:
    return _newest_first(svc.runs_page(session, dataset=dataset, offset=0, limit=1).total,
                         partial(_runs, session, dataset), page)


@router.get("/dashboard/api/datasets/{dataset}/models", response_model=Page[ModelVersionOut])
def models(dataset: DatasetP, _: SessionAdmin, session: SessionDep, page: DashboardPageQ) -> Page[ModelVersionOut]:
    return _newest_first(svc.versions_page(session, dataset=dataset, offset=0, limit=1).total,
                         partial(_versions, session, dataset), page)


@router.get("/dashboard/api/datasets/{dataset}/ledger", response_model=Page[LedgerEntryOut])
def ledger_table(dataset: DatasetP, _: SessionAdmin, session: SessionDep, page: DashboardPageQ) -> Page[LedgerEntryOut]:
    return _newest_first(svc.ledger_page(session, dataset=dataset, offset=0, limit=1).total,
                         partial(_ledger, session, dataset), page)


def _runs(session: Session, dataset: str, offset: int, limit: int) -> Page[TrainingRunOut]:
    return svc.runs_page(session, dataset=dataset, offset=offset, limit=limit)


def _versions(session: Session, dataset: str, offset: int, limit: int) -> Page[ModelVersionOut]:
    return svc.versions_page(session, dataset=dataset, offset=offset, limit=limit)


def _ledger(session: Session, dataset: str, offset: int, limit: int) -> Page[LedgerEntryOut]:
    return svc.ledger_page(session, dataset=dataset, offset=offset, limit=limit)


def _newest_first(total: int, fetch: Callable[[int, int], Page[T]], page: PageRequest) -> Page[T]:
    """Page ``page`` of the newest-first listing, whatever order the service lists in."""
    offset, limit = page.offset, page.limit
    end = max(0, total - offset)
    start = max(0, end - limit)
    first = fetch(0, 1).items
    last = fetch(max(total - 1, 0), 1).items
    ascending = not first or not last or _key(first[0]) <= _key(last[0])
    items: list[T]
    if not ascending:
        items = fetch(offset, limit).items
    elif end > start:
        items = list(reversed(fetch(start, end - start).items))
    else:
        items = []
    next_offset = offset + limit if offset + limit < total else None
    return Page[T](items=items, total=total, offset=offset, limit=limit, next_offset=next_offset)


def _key(item: Any) -> int:
    return int(getattr(item, "seq", 0) or getattr(item, "id", 0))


@router.post("/dashboard/api/datasets/{dataset}/trainings", status_code=202, response_model=DashboardTrainingOut)
def start_training(dataset: DatasetP, body: TrainingIn, claims: CsrfAdmin, session: WriteSessionDep,
                   settings: SettingsDep) -> DashboardTrainingOut:
    run_id = svc.start_training(session, dataset=dataset, body=body, actor=f"admin:{claims['sub']}")
    after_commit(session, partial(svc.enqueue, run_id, settings))  # never before the reservation is durable
    return DashboardTrainingOut(run_id=run_id, status="queued")


@router.post("/dashboard/api/datasets/{dataset}/models/{version_id}/activate", response_model=ModelVersionOut)
def activate(dataset: DatasetP, version_id: Annotated[int, PathParam(ge=1, le=2**31 - 1)], claims: CsrfAdmin,
             session: WriteSessionDep) -> ModelVersionOut:
    return svc.activate(session, dataset=dataset, version_id=int(version_id), actor=f"admin:{claims['sub']}")


@router.post("/dashboard/api/datasets/{dataset}/models/unpin", response_model=ModelVersionOut)
def unpin(dataset: DatasetP, claims: CsrfAdmin, session: WriteSessionDep) -> ModelVersionOut:
    return svc.unpin(session, dataset=dataset, actor=f"admin:{claims['sub']}")
