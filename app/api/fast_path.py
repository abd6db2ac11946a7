"""A shortcut for the hottest request: ``GET /v1/datasets/{dataset}/users/{user_id}/recommendations``
with at most ``n`` in its query and the caller's own bearer token.

FastAPI's routing, dependency solving and parameter validation cost about as much CPU as the
recommendation itself (≈ 0.4 ms a request). This innermost ASGI middleware answers the plain,
valid form of the request directly, with the same checks and the same code as the route
(:func:`app.api.routes.recommendations.recommendations_response`); every other request, and every
request it would refuse (malformed ids or ``n``, other query parameters, a missing, invalid or
foreign token, dependency overrides), goes to the app unchanged, so validation errors, 401s and
403s keep exactly the app's shape. Errors raised by the service go through the app's own
exception handlers, as they would from the route.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from app.api.deps import verify_bearer
from app.api.params import DATASET_MAX_LENGTH, DATASET_PATTERN
from app.api.routes import recommendations
from app.schemas.common import is_external_id
from app.schemas.serving import MAX_N, RecommendationQuery

__all__ = ["RecommendationFastPath", "plain_request"]

_PATH = re.compile(r"/v1/datasets/([^/]+)/users/([^/]+)/recommendations")
_DATASET = re.compile(DATASET_PATTERN)
_QUERY = re.compile(rb"n=([1-9][0-9]{0,3})")
_DEFAULT_N = 10  # the route's default for `n`


def _route() -> Any:
    """The route the shortcut stands for (its template labels the request's metrics)."""
    return next(r for r in recommendations.router.routes if getattr(r, "name", None) == "get_recommendations")


class RecommendationFastPath:
    """ASGI middleware: the plain recommendation request answered without FastAPI's routing."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.route = _route()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        plain = plain_request(scope) if scope["type"] == "http" else None
        if plain is None:
            await self.app(scope, receive, send)
            return
        dataset, user_id, n, token = plain
        app = scope["app"]
        try:
            allowed = (await verify_bearer(app, token)).may_act_for(user_id)
        except Exception:  # noqa: BLE001 - refused, or the revocation list could not be read
            allowed = False
        if not allowed:  # the app gives the 401, 403 or 503
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        scope["path_params"] = {"dataset": dataset, "user_id": user_id}
        try:
            response = await recommendations.recommendations_response(
                app, dataset, user_id, RecommendationQuery(n=n, categories=None, exclude=[]))
        except Exception as exc:
            handler = _handler(app, exc)
            if handler is None:
                raise  # the server-error middleware renders and logs it, as for the route
            response = await handler(Request(scope, receive), exc)
        await response(scope, receive, send)


def plain_request(scope: dict) -> tuple[str, str, int, str] | None:
    """(dataset, user id, n, bearer token) when the request is the plain, valid form of the
    recommendation GET that the route would accept; None for anything else."""
    if scope["method"] != "GET" or scope.get("root_path") or scope["app"].dependency_overrides:
        return None
    path = _PATH.fullmatch(scope["path"])
    if path is None:
        return None
    dataset, user_id = path.group(1), path.group(2)
    if not (len(dataset) <= DATASET_MAX_LENGTH and _DATASET.fullmatch(dataset)
            and is_external_id(user_id)):
        return None
    query = scope["query_string"]
    if query:
        n_match = _QUERY.fullmatch(query)
        if n_match is None or int(n_match.group(1)) > MAX_N:
            return None
        n = int(n_match.group(1))
    else:
        n = _DEFAULT_N
    token = _bearer_token(scope["headers"])
    return None if token is None else (dataset, user_id, n, token)


def _bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The credentials of the one ``Authorization: Bearer <token>`` header (as FastAPI's
    ``HTTPBearer`` reads it), or None."""
    found = [value for name, value in headers if name == b"authorization"]
    if len(found) != 1:
        return None
    scheme, _, credentials = found[0].decode("latin-1").partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


def _handler(app: Any, exc: Exception) -> Any:
    """The app's handler for ``exc`` as Starlette's exception middleware looks it up (the
    catch-all ``Exception`` handler belongs to the outer server-error middleware)."""
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        handler = app.exception_handlers.get(cls)
        if handler is not None:
            return handler
    return None
