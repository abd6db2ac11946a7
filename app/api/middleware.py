"""The ASGI middleware of the app, outermost first: request context (id, access log, metrics),
the opt-in ``Server-Timing`` header, the request body limit, the body's shape limits (per route,
before validation), the recommendation fast path (:mod:`app.api.fast_path`)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from itertools import chain
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from app.api.errors import render_error, route_template, validation_failed
from app.api.fast_path import RecommendationFastPath
from app.api.observability import LATENCY, REQUEST_ID, REQUESTS, access_log
from app.config import Settings
from app.errors import BatchTooLarge, BodyTooLarge, PayloadTooLarge, PrivrecError
from app.schemas.common import MAX_BATCH_ROWS
from app.schemas.ingest import RatingBatchIn
from app.schemas.public_data import MAX_NEIGHBOURS, MAX_PAIRS_PER_BATCH, NeighbourBatchIn
from app.schemas.votes import VoteBatchIn

__all__ = ["RequestContext", "ServerTiming", "BodyLimit", "BodyShape", "BodyShapeLimit", "MAX_BODY_BYTES",
           "SMALL_BODY_BYTES", "route_shape", "shape_violation", "install_middleware"]

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
            route = route_template(scope)
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


@dataclass(frozen=True)
class BodyShape:
    """Limits on a JSON body's structure, checked before validation (a body within them cannot
    make validation report more than ``max_values`` errors)."""

    max_items: int = 1000
    """Longest array (a batch route's rows: the batch limit, answered as ``batch_too_large``)."""
    max_keys: int = 128
    """Most keys in one object."""
    max_depth: int = 8
    """Deepest nesting of arrays and objects (the body itself is depth 1)."""
    max_values: int = 20_000
    """Most values (objects, arrays, scalars) in the whole body."""
    batch_key: str | None = None
    """The top-level key holding a batch's rows (its length is reported as rows)."""
    max_bytes: int = 1024 * 1024
    """Largest body (a batch route takes the global limit, :data:`MAX_BODY_BYTES`)."""
    model: type[BaseModel] | None = None
    """A batch route's body model: a large body is validated against it in the worker thread too,
    so a batch of bad rows is refused (the bounded 422) without validating on the event loop."""


_DS = "/v1/datasets/[^/]+"
_NEIGHBOURS = "/v1/admin/datasets/[^/]+/similarity-sources/[^/]+/neighbours"
_ROUTE_SHAPES: tuple[tuple[str, re.Pattern[str], BodyShape], ...] = (
    # a rating row is an object of 3 values, a vote row of at most 5
    ("POST", re.compile(f"{_DS}/ratings/batch"), BodyShape(
        max_items=MAX_BATCH_ROWS, max_keys=8, max_depth=4, max_values=4 * MAX_BATCH_ROWS + 64,
        batch_key="ratings", max_bytes=MAX_BODY_BYTES, model=RatingBatchIn)),
    ("POST", re.compile(f"{_DS}/votes/batch"), BodyShape(
        max_items=MAX_BATCH_ROWS, max_keys=8, max_depth=4, max_values=6 * MAX_BATCH_ROWS + 64,
        batch_key="votes", max_bytes=MAX_BODY_BYTES, model=VoteBatchIn)),
    ("POST", re.compile(_NEIGHBOURS), BodyShape(
        max_items=max(MAX_BATCH_ROWS, MAX_NEIGHBOURS), max_keys=8, max_depth=6,
        max_values=3 * MAX_BATCH_ROWS + 3 * MAX_PAIRS_PER_BATCH + 64, batch_key="rows", max_bytes=MAX_BODY_BYTES,
        model=NeighbourBatchIn)),
    ("POST", re.compile(f"{_DS}/users/[^/]+/recommendations"), BodyShape(
        max_items=10_000, max_values=11_000, max_bytes=2 * 1024 * 1024)),
    ("POST", re.compile("/v1/admin/datasets/[^/]+/trainings"), BodyShape(max_bytes=64 * 1024)),
)
DEFAULT_SHAPE = BodyShape()
SMALL_BODY_BYTES = 16 * 1024
"""Bodies up to this size go to validation unchecked (they hold a few thousand values at most);
larger ones are parsed and measured in a worker thread first."""


def route_shape(method: str, path: str) -> BodyShape:
    """The shape limits of a route's body (the default for every route not listed)."""
    for route_method, pattern, shape in _ROUTE_SHAPES:
        if method == route_method and pattern.fullmatch(path) is not None:
            return shape
    return DEFAULT_SHAPE


def shape_violation(value: Any, shape: BodyShape, max_rows: int = MAX_BATCH_ROWS) -> PayloadTooLarge | None:
    """The 413 refusing ``value`` (a parsed JSON body) when it passes one of ``shape``'s limits,
    or None. Walks the values iteratively and stops at the first limit passed."""
    rows = value.get(shape.batch_key) if shape.batch_key and type(value) is dict else None
    if type(rows) is list and len(rows) > max_rows:
        return BatchTooLarge(f"a batch holds at most {max_rows} rows; got {len(rows)}",
                             details={"max_rows": max_rows, "rows": len(rows)})
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        kind = type(node)
        if kind is dict:
            children: Any = node.values()
            if len(node) > shape.max_keys:
                return _too_complex(f"an object holds more than {shape.max_keys} keys", shape.max_keys)
        elif kind is list:
            children = node
            if len(node) > shape.max_items:
                return _too_complex(f"an array holds more than {shape.max_items} elements", shape.max_items)
            flat = _flat_rows(node)
            if flat is not None:  # a batch's rows: objects of scalars, measured in C-level passes
                widest, n_values = flat
                if widest > shape.max_keys:
                    return _too_complex(f"an object holds more than {shape.max_keys} keys", shape.max_keys)
                seen += len(node) + n_values
                if seen + len(stack) > shape.max_values:
                    return _too_complex(f"the body holds more than {shape.max_values} values", shape.max_values)
                if n_values and depth + 1 >= shape.max_depth:
                    return _too_complex(f"the body nests deeper than {shape.max_depth} levels", shape.max_depth)
                continue
        else:
            continue
        if seen + len(stack) + len(children) > shape.max_values:
            return _too_complex(f"the body holds more than {shape.max_values} values", shape.max_values)
        if children and depth >= shape.max_depth:
            return _too_complex(f"the body nests deeper than {shape.max_depth} levels", shape.max_depth)
        stack.extend((child, depth + 1) for child in children)
    return None


def _flat_rows(items: list[Any]) -> tuple[int, int] | None:
    """(most keys of one row, number of values) when ``items`` is a non-empty list of objects whose
    values are all scalars; None otherwise (walked value by value)."""
    if not items or set(map(type, items)) != {dict}:
        return None
    values = list(chain.from_iterable(map(dict.values, items)))
    if {dict, list} & set(map(type, values)):
        return None
    return max(map(len, items)), len(values)


def _too_complex(message: str, limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body too complex for this route: {message}; nothing was written",
                        details={"limit": limit})


def _too_large(shape: BodyShape) -> BodyTooLarge:
    return BodyTooLarge(f"request body exceeds {shape.max_bytes} bytes (this route's limit); nothing was written",
                        details={"max_bytes": shape.max_bytes})


def _is_json(scope: dict) -> bool:
    """Whether the route would parse the body as JSON (no content type, or ``application/*json``)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            kind = value.split(b";")[0].strip().lower()
            return kind.startswith(b"application/") and (kind.endswith(b"/json") or kind.endswith(b"+json"))
    return True


def _declared_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


def _measure(body: bytes, shape: BodyShape, max_rows: int, method: str) -> PrivrecError | None:
    """Parse ``body`` and return its shape violation, or its validation failure against the route's
    batch model (None: within the limits and valid, or not JSON, which the route then reports)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    refusal = shape_violation(value, shape, max_rows)
    if refusal is not None or shape.model is None:
        return refusal
    try:
        shape.model.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return validation_failed([{**e, "loc": ("body", *e["loc"])} for e in errors], method)
    return None


class BodyShapeLimit(_HttpMiddleware):
    """ASGI middleware: a JSON body larger than :data:`SMALL_BODY_BYTES` is read, parsed and its
    shape (array lengths, keys per object, depth, number of values) checked against the route's
    :class:`BodyShape` in a worker thread, before validation runs; past a limit the JSON 413 is
    sent and nothing is validated or written. Validation therefore never reports more errors than
    a route's limits allow, and a hostile body costs one parse off the event loop."""

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        declared = _declared_length(scope)
        if scope["method"] not in ("POST", "PUT", "PATCH") or not _is_json(scope) or (
                declared is not None and declared <= SMALL_BODY_BYTES):
            await self.app(scope, receive, send)
            return
        shape = route_shape(scope["method"], scope["path"])
        if declared is not None and declared > shape.max_bytes:
            await render_error(_too_large(shape))(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left, or the body limit already answered 413
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > shape.max_bytes:
                await render_error(_too_large(shape))(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if len(body) > SMALL_BODY_BYTES:
            settings = getattr(scope["app"].state, "settings", None)
            max_rows = min(MAX_BATCH_ROWS, getattr(settings, "max_batch_size", MAX_BATCH_ROWS))
            refusal = await run_in_threadpool(_measure, body, shape, max_rows, scope["method"])
            if refusal is not None:
                await render_error(refusal)(scope, receive, send)
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def install_middleware(app: FastAPI, settings: Settings) -> None:
    """Add the middleware; the last added runs first (request context outermost, the fast path
    innermost: the requests it answers still get their id, metrics, timing and body limit; the
    shape check sees only bodies within the size limit)."""
    app.add_middleware(RecommendationFastPath)
    app.add_middleware(BodyShapeLimit)
    app.add_middleware(BodyLimit)
    if settings.server_timing:  # opt-in: response times can reveal data-dependent work
        app.add_middleware(ServerTiming)
    app.add_middleware(RequestContext)
