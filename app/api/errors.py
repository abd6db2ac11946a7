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
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import InterfaceError, OperationalError
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


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        item = {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        if "input" in err and err.get("type") != "json_invalid":
            inp = err["input"]
            if isinstance(inp, (str, int, float, bool)) or inp is None:
                item["input"] = inp
        out.append(item)
    return out


async def _privrec_error(_: Request, exc: PrivrecError) -> JSONResponse:
    return render_error(exc)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {})
        return render_error(MalformedJson("request body is not valid JSON", details={"error": str(ctx.get("error", ""))}))
    message = "request validation failed"
    if request.method not in READ_METHODS:
        message += "; nothing was written"
    return render_error(ValidationFailed(message, details=_validation_details(exc)))


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


async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    condition = {404: RouteNotFound, 405: MethodNotAllowed}.get(exc.status_code, HttpError)
    message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return render_error(condition(message, headers=headers or None), exc.status_code)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The driver's message can carry SQL parameters (private values): log the type only.
    log.warning("database unavailable in %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return render_error(DatabaseUnavailable("the database is not reachable; retry later", headers={"Retry-After": "5"}))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Log the exception type and the stack only: messages can carry SQL parameters, i.e.
    # private ratings, and request bodies are never logged.
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("unhandled %s in %s %s\n%s", type(exc).__name__, request.method, request.url.path, stack)
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
    app.add_exception_handler(Exception, _unexpected)

