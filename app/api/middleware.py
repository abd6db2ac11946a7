"""The ASGI middleware of the app, outermost first: request context (id, access log, metrics),
the opt-in ``Server-Timing`` header, the request body limit, the recommendation fast path
(:mod:`app.api.fast_path`)."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI

from app.api.errors import render_error
from app.api.fast_path import RecommendationFastPath
from app.api.observability import LATENCY, REQUEST_ID, REQUESTS, access_log
from app.config import Settings
from app.errors import BodyTooLarge

__all__ = ["RequestContext", "ServerTiming", "BodyLimit", "MAX_BODY_BYTES", "install_middleware"]

MAX_BODY_BYTES = 16 * 1024 * 1024  # a full 10,000-row batch with 128-character ids is ~3 MiB
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class _HttpMiddleware:
    """An ASGI middleware that passes non-HTTP scopes (lifespan, websockets) through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        """Serve one HTTP request."""
        raise NotImplementedError


class RequestContext(_HttpMiddleware):
    """ASGI middleware: request id, access log line (route template, status, ms) and metrics."""

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        rid = _request_id(scope)
        token = REQUEST_ID.set(rid)
        start = time.perf_counter()
        status = 500
        id_header = (b"x-request-id", rid.encode())

        async def send_with_id(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {**message, "headers": [*message.get("headers", []), id_header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - start
            route = _template(scope)
            count, latency = _metrics(scope["method"], route, status)
            count.inc()
            latency.observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info("request", extra={"http": {"method": scope["method"], "route": route,
                                                           "status": status, "ms": round(elapsed * 1000, 3)}})
            REQUEST_ID.reset(token)


def _request_id(scope: dict) -> str:
    """A safe incoming ``X-Request-ID`` (the last one sent) or a fresh random id."""
    incoming = ""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            incoming = value.decode("latin-1")
    return incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex


_CHILDREN: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _metrics(method: str, route: str, status: int) -> tuple[Any, Any]:
    """The request counter and latency histogram children for these labels (``labels()``
    validates and locks on every call; the children are looked up once per label set). Routes
    are templates, so the label sets stay few."""
    key = (method, route, status)
    children = _CHILDREN.get(key)
    if children is None:
        children = _CHILDREN[key] = (REQUESTS.labels(method, route, str(status)), LATENCY.labels(method, route))
    return children


_TEMPLATES: dict[int, list[tuple[re.Pattern[str], str]]] = {}
_CANDIDATES: dict[tuple[int, str], list[tuple[re.Pattern[str], str]]] = {}


def _template(scope: dict) -> str:
    """The full route template of the request (the matched route knows only its own part
    below the router's prefix), from the app's OpenAPI paths; "unmatched" for unknown paths."""
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


class ServerTiming(_HttpMiddleware):
    """ASGI middleware adding ``Server-Timing: app;dur=<ms>`` (time spent inside the app).

    Opt-in (``SERVER_TIMING=true``): a precise per-request duration is a timing side channel
    (e.g. a fold-in's cost grows with the user's history), so it is off by default."""

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        start = time.perf_counter()

        async def send_with_timing(message: dict) -> None:
            if message["type"] == "http.response.start":
                dur = (time.perf_counter() - start) * 1000.0
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", f"app;dur={dur:.3f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_timing)


class BodyLimit(_HttpMiddleware):
    """ASGI middleware refusing request bodies above ``max_bytes`` with the JSON 413 error.

    A declared Content-Length is checked before anything is read; a streamed body is counted
    while the route reads it; past the limit the 413 is sent and the rest of the request dropped.
    """

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    def _error(self) -> BodyTooLarge:
        return BodyTooLarge(f"request body exceeds {self.max_bytes} bytes",
                            details={"max_bytes": self.max_bytes})

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await render_error(self._error())(scope, receive, send)
                return
        seen = 0
        responded = False

        async def guarded_send(message: dict) -> None:
            if not responded:  # after our 413 the app's own response is dropped
                await send(message)

        async def counting_receive() -> dict:
            nonlocal seen, responded
            message = await receive()
            if message["type"] == "http.request" and not responded:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    await render_error(self._error())(scope, receive, send)
                    responded = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counting_receive, guarded_send)


def install_middleware(app: FastAPI, settings: Settings) -> None:
    """Add the middleware; the last added runs first (request context outermost, the fast path
    innermost: the requests it answers still get their id, metrics, timing and body limit)."""
    app.add_middleware(RecommendationFastPath)
    app.add_middleware(BodyLimit)
    if settings.server_timing:  # opt-in: response times can reveal data-dependent work
        app.add_middleware(ServerTiming)
    app.add_middleware(RequestContext)
