"""One error shape for the whole API: ``{"error": {"code", "message", "details"}}``.

Every failure the service reports is an :class:`app.errors.PrivrecError`, rendered by one handler;
the handlers below convert the rest (request validation errors, malformed JSON, unknown routes,
an unreachable database, unexpected exceptions) into the same shape. ``app.api.contract`` documents
the codes of every route in the OpenAPI document.
"""

from __future__ import annotations

import logging
import math
import re
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import (
    DatabaseUnavailable,
    HttpError,
    InternalError,
    MalformedJson,
    MethodNotAllowed,
    PrivrecError,
    RouteNotFound,
    ValidationFailed,
)

log = logging.getLogger("privrec.api")

__all__ = [
    "ErrorBody",
    "ErrorResponse",
    "render",
    "render_error",
    "install_error_handlers",
    "route_template",
    "validation_details",
    "validation_failed",
    "MAX_REPORTED_ERRORS",
]


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable error code, e.g. `validation_error`.")
    message: str = Field(description="Human-readable explanation.")
    details: Any = Field(default=None, description="Structured context (offending fields, rows, budget figures).")


class ErrorResponse(BaseModel):
    """The single error shape of the API."""

    error: ErrorBody


def render(status: int, code: str, message: str, details: Any = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    """Build the JSON response of the one error shape."""
    body = {"error": {"code": code, "message": message, "details": _json_safe(details)}}
    return JSONResponse(status_code=status, content=body, headers=headers)


def render_error(error: PrivrecError, status: int | None = None) -> JSONResponse:
    """The response of ``error``: its class's status (or ``status``) and code, its message and details."""
    return render(status or error.status_code, error.code, error.message, error.details, error.headers)


def _json_safe(value: Any) -> Any:
    """jsonable_encoder plus NaN/inf -> string (JSON has no non-finite numbers)."""
    value = jsonable_encoder(value, custom_encoder={bytes: lambda b: b.decode("utf-8", "replace")})
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


MAX_REPORTED_ERRORS = 20
"""A validation error lists at most this many offending elements (and states how many there were)."""
_MAX_LOC_TEXT = 64  # a location's key is cut to this many characters (keys come from the body)
_MAX_MSG_TEXT = 1000


def _loc_part(part: Any, limit: int = _MAX_LOC_TEXT) -> Any:
    """One element of an error location, safe to send back: indices as they are, keys (client
    text) cut short and escaped where they are not valid Unicode (a lone surrogate)."""
    if isinstance(part, int):
        return part
    text = str(part)
    short = text[:limit] + ("…" if len(text) > limit else "")
    return short.encode("utf-8", "backslashreplace").decode("utf-8")


def validation_details(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """The first :data:`MAX_REPORTED_ERRORS` errors as ``{loc, msg, type}``: never the offending
    input (it can be large, private or not valid Unicode)."""
    return [{"loc": [_loc_part(p) for p in err.get("loc", ())],
             "msg": _loc_part(err.get("msg", ""), _MAX_MSG_TEXT), "type": str(err.get("type", ""))}
            for err in errors[:MAX_REPORTED_ERRORS]]


async def _privrec_error(_: Request, exc: PrivrecError) -> JSONResponse:
    return render_error(exc)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    invalid_json = next((e for e in errors[:MAX_REPORTED_ERRORS] if e.get("type") == "json_invalid"), None)
    if invalid_json is not None:
        ctx = invalid_json.get("ctx", {})
        return render_error(MalformedJson("request body is not valid JSON",
                                          details={"error": _loc_part(ctx.get("error", ""), _MAX_MSG_TEXT)}))
    return render_error(validation_failed(errors, request.method))


def validation_failed(errors: Sequence[Any], method: str) -> ValidationFailed:
    """The 422 of a request whose validation reported ``errors`` (the first few listed, all counted)."""
    total = len(errors)
    message = "request validation failed" if total == 1 else (
        f"request validation failed: {total} errors" + (
            f", the first {MAX_REPORTED_ERRORS} listed" if total > MAX_REPORTED_ERRORS else ""))
    if method not in READ_METHODS:
        message += "; nothing was written"
    return ValidationFailed(message, details=validation_details(errors))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path, read off the app's OpenAPI paths
    (Starlette names only the first matching route's methods in ``Allow``)."""
    path = request.url.path
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            methods |= {m.upper() for m in operations}
    return sorted(methods)


# FastAPI's 400 for a body it could not read at all (bytes that are not UTF-8 JSON text): the
# documented ``malformed_json`` of every route that takes a body, like invalid JSON.
_UNPARSABLE_BODY = "There was an error parsing the body"


async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.detail == _UNPARSABLE_BODY:
        return render_error(MalformedJson("request body is not valid JSON (it could not be decoded)"))
    condition = {404: RouteNotFound, 405: MethodNotAllowed}.get(exc.status_code, HttpError)
    message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return render_error(condition(message, headers=headers or None), exc.status_code)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The driver's message can carry SQL parameters (private values): log the type only, and the
    # route's template, never the raw path (it names users and items).
    log.warning("database unavailable in %s %s: %s", request.method, route_template(request.scope), type(exc).__name__)
    return render_error(DatabaseUnavailable("the database is not reachable; retry later", headers={"Retry-After": "5"}))


async def _pool_timeout(request: Request, exc: Exception) -> JSONResponse:
    """No connection came free within the pool's timeout (an overloaded process): 503 with
    ``Retry-After``, never a 500. A retry is safe where nothing was committed; a route that
    commits a reservation and then needs another connection (the training route's enqueue)
    must answer for the committed run itself rather than let the timeout reach this handler."""
    log.warning("database pool exhausted in %s %s: %s", request.method, route_template(request.scope), type(exc).__name__)
    return render_error(DatabaseUnavailable("the database is busy (no connection free in time); retry later",
                                            headers={"Retry-After": "2"}))


_TEMPLATES: dict[int, list[tuple[re.Pattern[str], str]]] = {}
_CANDIDATES: dict[tuple[int, str], list[tuple[re.Pattern[str], str]]] = {}


def route_template(scope: Mapping[str, Any]) -> str:
    """The full route template of a request's scope (the matched route knows only its own part
    below the router's prefix), from the app's OpenAPI paths; "unmatched" for unknown paths. Logs
    and metrics name this, never the raw path (it names users and items)."""
    route = getattr(scope.get("route"), "path", None)
    app = scope.get("app")
    if route is None or app is None:
        return "unmatched"
    candidates = _CANDIDATES.get((id(app), route))
    if candidates is None:  # the OpenAPI paths ending with this route's path, once per route
        patterns = _TEMPLATES.get(id(app))
        if patterns is None:
            patterns = _TEMPLATES[id(app)] = [
                (re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(t)) + "$"), t)
                for t in app.openapi().get("paths", {})]
        candidates = _CANDIDATES[(id(app), route)] = [(p, t) for p, t in patterns if t.endswith(route)]
    path = scope.get("path", "")
    for pattern, template in candidates:
        if pattern.match(path):
            return template
    return route


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Log the exception type and the stack only: messages can carry SQL parameters, i.e.
    # private ratings, and request bodies are never logged.
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("unhandled %s in %s %s\n%s", type(exc).__name__, request.method, route_template(request.scope), stack)
    return render_error(InternalError("unexpected server error"))


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the one error shape."""
    # Starlette types a handler as taking any Exception; each of these is registered for (and only
    # ever called with) its own exception class, hence the ignores.
    app.add_exception_handler(PrivrecError, _privrec_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _request_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_exception)  # type: ignore[arg-type]

    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
    app.add_exception_handler(PoolTimeout, _pool_timeout)
    app.add_exception_handler(Exception, _unexpected)

