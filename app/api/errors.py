"""One error shape for the whole API: ``{"error": {"code", "message", "details"}}``.

Every failure the service reports is an :class:`app.errors.PrivrecError`, rendered by one handler;
the handlers below convert the rest (request validation errors, malformed JSON, unknown routes,
an unreachable database, unexpected exceptions) into the same shape. :data:`ERROR_RESPONSES` lists
the shape in the OpenAPI document of every route.
"""

from __future__ import annotations

import logging
import math
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import PrivrecError

log = logging.getLogger("privrec.api")

__all__ = [
    "ErrorBody",
    "ErrorResponse",
    "ERROR_RESPONSES",
    "errors",
    "render",
    "install_error_handlers",
]


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable error code, e.g. `validation_error`.")
    message: str = Field(description="Human-readable explanation.")
    details: Any = Field(default=None, description="Structured context (offending fields, rows, budget figures).")


class ErrorResponse(BaseModel):
    """The single error shape of the API."""

    error: ErrorBody


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _doc("Malformed request (e.g. body is not valid JSON)."),
    401: _doc("Missing, expired or tampered bearer token."),
    403: _doc("The token is valid but may not act on this resource."),
    404: _doc("Unknown resource."),
    409: _doc("Conflict with the current state (e.g. privacy budget exhausted)."),
    413: _doc("Request too large (e.g. more than 10,000 rows in a batch)."),
    422: _doc("Request validation failed; a write route wrote nothing."),
    503: _doc("A dependency (database, model store) is not ready; retry later."),
}
"""Every error status the API documents. Routes document only those they can return
(``app.api.contract.document_route_errors``); an unexpected failure (500) is a bug and is not documented."""


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the route-specific codes ``codes`` (e.g. ``errors(409)``)."""
    return {code: ERROR_RESPONSES[code] for code in codes}


def render(status: int, code: str, message: str, details: Any = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    """Build the JSON response of the one error shape."""
    body = {"error": {"code": code, "message": message, "details": _json_safe(details)}}
    return JSONResponse(status_code=status, content=body, headers=headers)


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
    return render(exc.status_code, exc.code, exc.message, exc.details, exc.headers)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {})
        return render(400, "malformed_json", "request body is not valid JSON",
                      {"error": str(ctx.get("error", ""))})
    message = "request validation failed"
    if request.method not in READ_METHODS:
        message += "; nothing was written"
    return render(422, "validation_error", message, _validation_details(exc))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path, read off the app's OpenAPI paths
    (Starlette names only the first matching route's methods in ``Allow``)."""
    import re

    path = request.url.path
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            methods |= {m.upper() for m in operations}
    return sorted(methods)


async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 403: "forbidden"}
    code = codes.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return render(exc.status_code, code, message, None, headers or None)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The driver's message can carry SQL parameters (private values): log the type only.
    log.warning("database unavailable in %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return render(503, "database_unavailable", "the database is not reachable; retry later", None,
                  {"Retry-After": "5"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Log the exception type and the stack only: messages can carry SQL parameters, i.e.
    # private ratings, and request bodies are never logged.
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("unhandled %s in %s %s\n%s", type(exc).__name__, request.method, request.url.path, stack)
    return render(500, "internal_error", "unexpected server error", None)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the one error shape."""
    app.add_exception_handler(PrivrecError, _privrec_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _request_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_exception)  # type: ignore[arg-type]
    from sqlalchemy.exc import InterfaceError, OperationalError

    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
    app.add_exception_handler(Exception, _unexpected)

