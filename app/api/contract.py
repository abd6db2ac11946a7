"""The documented error codes of every route, derived from what the route takes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from app.api.errors import ERROR_RESPONSES

__all__ = ["document_errors", "install_error_docs", "CONFLICTS"]

_MODEL = "an unreadable or altered model artifact"
CONFLICTS: dict[tuple[str, str], str] = {
    ("POST", "/v1/admin/datasets"): "the data set exists, or its relation does not imply its person budget's",
    ("PATCH", "/v1/admin/datasets/{dataset}/budget"): "lowering the cap below the spend",
    ("POST", "/v1/admin/datasets/{dataset}/trainings"): ("the run would exceed the privacy budget (the data set's "
                                                         "or the per-person one), or its relation does not imply "
                                                         "the data set's"),
    ("PUT", "/v1/admin/person-budgets/{name}"): "lowering the cap below the spend, or changing its delta or relation",
    ("POST", "/v1/admin/datasets/{dataset}/models/{version_id}/activate"): "the version's artifact is missing",
    ("PUT", "/v1/admin/datasets/{dataset}/vote-settings"): ("votes exist (the settings are frozen), the guarantee "
                                                            "would exceed a budget, or the data set's relation is "
                                                            "not replace_vote_values"),
    ("PUT", "/v1/datasets/{dataset}/users/{user_id}/votes/{item_id}"): "the user's vote allowance is used up",
    ("POST", "/v1/datasets/{dataset}/votes/batch"): "a user's vote allowance is used up",
    ("GET", "/v1/datasets/{dataset}/model"): _MODEL,
    ("GET", "/v1/datasets/{dataset}/model/embeddings"): _MODEL,
    ("GET", "/v1/datasets/{dataset}/model/embeddings.npy"): _MODEL,
    ("GET", "/v1/datasets/{dataset}/items/{item_id}/similar"): _MODEL,
    ("GET", "/v1/datasets/{dataset}/popular"): _MODEL,
    ("GET", "/v1/datasets/{dataset}/users/{user_id}/recommendations"): _MODEL,
    ("POST", "/v1/datasets/{dataset}/users/{user_id}/recommendations"): _MODEL,
}
"""Routes that can answer 409, and why."""



def _operation_codes(operation: dict[str, Any], path_params: bool) -> set[int]:
    """The error codes an operation can return, read off what it takes."""
    params = operation.get("parameters", [])
    body = "requestBody" in operation
    codes = {503}  # every /v1 route reads the database
    if operation.get("security"):
        codes |= {401, 403}
    if path_params:
        codes.add(404)
    if params or body:
        codes.add(422)
    if body:
        codes |= {400, 413}
    return codes


def _response(code: int) -> dict[str, Any]:
    doc = ERROR_RESPONSES[code]
    return {"description": doc["description"],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Add to each ``/v1`` operation of an OpenAPI document the error codes it can return: 401/403
    when it takes a token, 404 with path parameters (unknown data set, user, item or id), 422 with
    parameters, 400/413 with a body, 503 (database down) always, 409 where :data:`CONFLICTS` says."""
    for path, operations in schema.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            for code in sorted(_operation_codes(op, "{" in path)):
                responses.setdefault(str(code), _response(code))
            if "422" in responses:  # ours, not FastAPI's default validation schema
                responses["422"] = {**_response(422), "description": (
                    "Request validation failed." if method.upper() == "GET" else
                    "Request validation failed; nothing was written.")}
            if (method.upper(), path) in CONFLICTS:
                responses.setdefault("409", {**_response(409), "description": f"Conflict: {CONFLICTS[method.upper(), path]}."})
            op["responses"] = dict(sorted(responses.items()))
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(_error_schemas())
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return schema


def _error_schemas() -> dict[str, Any]:
    from pydantic.json_schema import models_json_schema

    from app.api.errors import ErrorResponse

    _, defs = models_json_schema([(ErrorResponse, "serialization")], ref_template="#/components/schemas/{model}")
    return defs.get("$defs", {})


def install_error_docs(app: FastAPI) -> None:
    """Make ``app.openapi()`` document each operation's error codes (:func:`document_errors`)."""
    default = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(default())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
