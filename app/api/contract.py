"""The documented error codes of every route: one table, read by the OpenAPI generator.

Each ``/v1`` operation documents, per HTTP status, the codes it can return (``x-error-codes``) with
their meanings (from :data:`app.errors.ERROR_CODES`). The codes that follow from what a route
takes are derived (:func:`shape_errors`); the domain conditions of each route are listed in
:data:`ROUTE_ERRORS`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from app.api.errors import ErrorResponse
from app.errors import (
    ERROR_CODES,
    AdminRequired,
    ArtifactMissing,
    ArtifactUnreadable,
    BatchTooLarge,
    BodyTooLarge,
    BudgetExceeded,
    CalibrationFailed,
    CapChangeRefused,
    CapRequired,
    CatalogueTooSmall,
    ClientRandomisationForbidden,
    DatabaseUnavailable,
    DatasetExists,
    DeltaRequired,
    HttpError,
    IdempotencyKeyReused,
    InvalidDatasetName,
    InvalidDelta,
    InvalidEpsilon,
    InvalidEpsilonCap,
    InvalidHyperparameters,
    InvalidIdempotencyKey,
    InvalidPersonBudgetName,
    InvalidRatingRange,
    InvalidRelation,
    InvalidRetrainPolicy,
    InvalidRows,
    InvalidSourceName,
    InvalidToken,
    ItemNotInModel,
    ItemsNotInModel,
    LocalEpsilonMismatch,
    MalformedJson,
    MissingToken,
    NoActiveModel,
    NotDeclaredPublic,
    OwnUserRequired,
    PersonBudgetExceeded,
    PersonBudgetExists,
    PersonBudgetFixed,
    PersonBudgetMissing,
    PrivacyUnitFixed,
    PrivacyUnitMismatch,
    PrivacyUnitNotSupported,
    PrivrecError,
    ProvenanceRequired,
    RandomisedNotAccepted,
    RatingOutOfRange,
    ReasonRequired,
    RelationRefused,
    RunFinished,
    ScopeRequired,
    SecretHyperparameter,
    TokenExpired,
    TokenRevoked,
    UnknownAlgorithm,
    UnknownDataset,
    UnknownItem,
    UnknownModelVersion,
    UnknownPersonBudget,
    UnknownRating,
    UnknownSimilaritySource,
    UnknownTrainingRun,
    UnknownUser,
    UnknownVote,
    ValidationFailed,
    VoteCapExceeded,
    VotesExist,
    WriteConflict,
    WrongSubject,
    meaning,
)

__all__ = ["LINKS", "ROUTE_ERRORS", "document_errors", "document_links", "install_error_docs", "operation_errors",
           "shape_errors", "error_table_markdown"]

Errors = tuple[type[PrivrecError], ...]

_DS = "/v1/datasets/{dataset}"
_ADMIN_DS = "/v1/admin/datasets/{dataset}"
_USER = f"{_DS}/users/{{user_id}}"
_SOURCE = f"{_ADMIN_DS}/similarity-sources/{{source}}"
_MODEL: Errors = (NoActiveModel, ArtifactUnreadable)
_BUDGET_REFUSALS: Errors = (BudgetExceeded, PersonBudgetExceeded, RelationRefused)
_RUN_CHOICE: Errors = (UnknownAlgorithm, SecretHyperparameter, InvalidHyperparameters, CatalogueTooSmall,
                       InvalidEpsilon, CalibrationFailed)
_VOTE_ROW: Errors = (WrongSubject, ClientRandomisationForbidden, VoteCapExceeded)
_NEW_BUDGET: Errors = (InvalidEpsilonCap, InvalidDelta, InvalidRelation)

ROUTE_ERRORS: dict[tuple[str, str], Errors] = {
    # ratings, users, items
    ("PUT", f"{_USER}/ratings/{{item_id}}"): (WrongSubject, UnknownItem, RatingOutOfRange, WriteConflict),
    ("POST", f"{_DS}/ratings/batch"): (WrongSubject, BatchTooLarge, InvalidRows, WriteConflict),
    ("DELETE", f"{_USER}/ratings/{{item_id}}"): (WrongSubject, UnknownRating, WriteConflict),
    ("DELETE", "/v1/users/{user_id}"): (WrongSubject, UnknownUser, WriteConflict),
    ("PUT", f"{_DS}/items/{{item_id}}"): (ScopeRequired,),
    ("GET", f"{_DS}/items/{{item_id}}"): (UnknownItem,),
    ("GET", f"{_USER}/ratings"): (WrongSubject,),
    # published model
    ("GET", f"{_DS}/model"): _MODEL,
    ("GET", f"{_DS}/model/embeddings"): _MODEL,
    ("GET", f"{_DS}/model/embeddings.npy"): _MODEL,
    ("GET", f"{_DS}/items/{{item_id}}/similar"): (*_MODEL, ItemNotInModel),
    ("GET", f"{_DS}/popular"): _MODEL,
    ("GET", f"{_USER}/recommendations"): (WrongSubject, *_MODEL),
    ("POST", f"{_USER}/recommendations"): (WrongSubject, *_MODEL, ItemsNotInModel),
    # votes
    ("PUT", f"{_USER}/votes/{{item_id}}"): (*_VOTE_ROW, UnknownItem, RandomisedNotAccepted, LocalEpsilonMismatch),
    ("POST", f"{_DS}/votes/batch"): (*_VOTE_ROW, BatchTooLarge, InvalidRows),
    ("DELETE", f"{_USER}/votes/{{item_id}}"): (WrongSubject, UnknownVote),
    ("GET", f"{_USER}/votes"): (WrongSubject,),
    ("PUT", f"{_ADMIN_DS}/vote-settings"): (VotesExist, *_BUDGET_REFUSALS, CapRequired, PrivacyUnitNotSupported),
    # public data
    ("PUT", f"{_USER}/public-ratings"): (OwnUserRequired, WrongSubject),
    ("GET", f"{_USER}/public-ratings"): (WrongSubject,),
    ("PUT", _SOURCE): (InvalidSourceName, NotDeclaredPublic, ProvenanceRequired),
    ("GET", _SOURCE): (UnknownSimilaritySource,),
    ("DELETE", _SOURCE): (UnknownSimilaritySource,),
    ("POST", f"{_SOURCE}/neighbours"): (UnknownSimilaritySource, BatchTooLarge, InvalidRows),
    ("GET", f"{_SOURCE}/neighbours/{{item_id}}"): (UnknownSimilaritySource, UnknownItem),
    # admin: data sets, budgets, trainings, models
    ("POST", "/v1/admin/datasets"): (DatasetExists, RelationRefused, InvalidDatasetName, InvalidRatingRange,
                                     *_NEW_BUDGET, PersonBudgetMissing, PrivacyUnitMismatch, PrivacyUnitNotSupported),
    ("PATCH", _ADMIN_DS): (PrivacyUnitFixed, PrivacyUnitNotSupported),
    ("GET", f"{_ADMIN_DS}/budget/projection"): (RelationRefused, *_RUN_CHOICE),
    ("GET", f"{_ADMIN_DS}/budget/forecast"): (RelationRefused, UnknownAlgorithm, InvalidHyperparameters,
                                              CalibrationFailed),
    ("PUT", f"{_ADMIN_DS}/retrain-policy"): (InvalidRetrainPolicy,),
    ("PATCH", f"{_ADMIN_DS}/budget"): (CapChangeRefused, InvalidEpsilonCap, ReasonRequired),
    ("GET", "/v1/admin/person-budgets/{name}"): (UnknownPersonBudget,),
    ("GET", "/v1/admin/person-budgets/{name}/blocks"): (UnknownPersonBudget,),
    ("PUT", "/v1/admin/person-budgets/{name}"): (PersonBudgetFixed, PersonBudgetExists, CapChangeRefused,
                                                 *_NEW_BUDGET, InvalidPersonBudgetName, DeltaRequired,
                                                 ReasonRequired),
    ("POST", f"{_ADMIN_DS}/trainings"): (*_BUDGET_REFUSALS, *_RUN_CHOICE, InvalidIdempotencyKey, IdempotencyKeyReused,
                                         PrivacyUnitNotSupported),
    ("GET", "/v1/admin/trainings/{run_id}"): (UnknownTrainingRun,),
    ("POST", "/v1/admin/trainings/{run_id}/cancel"): (UnknownTrainingRun, RunFinished),
    ("POST", f"{_ADMIN_DS}/models/{{version_id}}/activate"): (UnknownModelVersion, ArtifactMissing),
    ("POST", f"{_ADMIN_DS}/models/unpin"): (NoActiveModel, ArtifactMissing),
}
"""The domain conditions of each route (method, path template) beyond those its shape implies."""

_SAME_RATING = {"dataset": "$request.path.dataset", "user_id": "$request.path.user_id",
                "item_id": "$request.path.item_id"}
_NEW_DATASET = {"dataset": "$response.body#/name"}
_NEW_RUN = {"run_id": "$response.body#/run_id"}
LINKS: dict[tuple[str, str], dict[str, tuple[str, str, dict[str, str]]]] = {
    # source operation -> link name -> (method, path, parameters): what a client can do next with
    # what an operation's success answer names (OpenAPI links; Schemathesis's stateful phase follows them)
    ("POST", "/v1/admin/datasets"): {
        "GetBudget": ("GET", f"{_ADMIN_DS}/budget", _NEW_DATASET),
        "StartTraining": ("POST", f"{_ADMIN_DS}/trainings", _NEW_DATASET),
        "PutItem": ("PUT", f"{_DS}/items/{{item_id}}", _NEW_DATASET),
    },
    ("POST", f"{_ADMIN_DS}/trainings"): {
        "GetTraining": ("GET", "/v1/admin/trainings/{run_id}", _NEW_RUN),
        "CancelTraining": ("POST", "/v1/admin/trainings/{run_id}/cancel", _NEW_RUN),
    },
    ("PUT", f"{_DS}/items/{{item_id}}"): {
        "RateItem": ("PUT", f"{_USER}/ratings/{{item_id}}",
                     {"dataset": "$request.path.dataset", "item_id": "$request.path.item_id"}),
    },
    ("PUT", f"{_USER}/ratings/{{item_id}}"): {
        "DeleteRating": ("DELETE", f"{_USER}/ratings/{{item_id}}", _SAME_RATING),
        "GetUserRatings": ("GET", f"{_USER}/ratings",
                           {"dataset": "$request.path.dataset", "user_id": "$request.path.user_id"}),
        "DeleteUser": ("DELETE", "/v1/users/{user_id}", {"user_id": "$request.path.user_id"}),
    },
    ("PUT", f"{_USER}/votes/{{item_id}}"): {
        "DeleteVote": ("DELETE", f"{_USER}/votes/{{item_id}}", _SAME_RATING),
    },
}
"""OpenAPI links from each operation's success answers (:func:`document_links`)."""

STATUS_TEXT = {400: "Malformed request.", 401: "Missing, expired or tampered bearer token.",
               403: "The token is valid but may not act on this resource.", 404: "Unknown resource.",
               409: "Conflict with the current state.", 413: "Request too large.",
               422: "The request is invalid.", 503: "A dependency is not ready; retry later."}
"""The summary of each documented error status (its codes are listed below it)."""


def shape_errors(method: str, path: str, operation: dict[str, Any]) -> Errors:
    """The conditions implied by what an operation takes: the database (every ``/v1`` route), a
    token (and an admin token under ``/v1/admin``), the ``{dataset}`` path parameter, parameters
    or a body (request validation), a body (malformed JSON, size)."""
    out: list[type[PrivrecError]] = [DatabaseUnavailable]
    if operation.get("security"):
        out += [MissingToken, InvalidToken, TokenExpired, TokenRevoked]
        if path.startswith("/v1/admin/"):
            out.append(AdminRequired)
    if "{dataset}" in path:
        out.append(UnknownDataset)
    if operation.get("parameters") or "requestBody" in operation:
        out.append(ValidationFailed)
    if "requestBody" in operation:
        out += [MalformedJson, BodyTooLarge]
    return tuple(out)


def operation_errors(method: str, path: str, operation: dict[str, Any]) -> dict[int, list[str]]:
    """HTTP status -> the codes an operation can return (shape-derived, then its domain conditions)."""
    by_status: dict[int, list[str]] = defaultdict(list)
    for error in (*shape_errors(method, path, operation), *ROUTE_ERRORS.get((method.upper(), path), ())):
        if error.code not in by_status[error.status_code]:
            by_status[error.status_code].append(error.code)
    return dict(sorted(by_status.items()))


def _response(status: int, codes: list[str], method: str) -> dict[str, Any]:
    text = STATUS_TEXT[status]
    if status == 422 and method.upper() != "GET":
        text = "The request is invalid; nothing was written."
    lines = "\n".join(f"* `{code}`: {meaning(ERROR_CODES[code])}" for code in codes)
    return {"description": f"{text}\n\n{lines}",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
            "x-error-codes": list(codes)}


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Add to each ``/v1`` operation of an OpenAPI document, per error status, the codes it can
    return (:func:`operation_errors`), replacing FastAPI's default 422."""
    for path, operations in schema.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for method, op in operations.items():
            responses = {k: v for k, v in op.setdefault("responses", {}).items() if k != "422"}
            for status, codes in operation_errors(method, path, op).items():
                responses[str(status)] = _response(status, codes, method)
            op["responses"] = dict(sorted(responses.items()))
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(_error_schemas())
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return schema


def _error_schemas() -> dict[str, Any]:
    _, defs = models_json_schema([(ErrorResponse, "serialization")], ref_template="#/components/schemas/{model}")
    return defs.get("$defs", {})


def _status_label(error: type[PrivrecError]) -> str:
    return "4xx" if error is HttpError else str(error.status_code)


def error_table_markdown() -> str:
    """The README's error-code table (code, HTTP status, meaning), ordered by status then code."""
    rows = sorted(ERROR_CODES.items(), key=lambda kv: (kv[1].status_code, kv[0]))
    lines = ["| code | HTTP status | returned by | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{code}` | {_status_label(error)} | {error.where} | {meaning(error)} |" for code, error in rows]
    return "\n".join(lines) + "\n"


def document_links(schema: dict[str, Any]) -> dict[str, Any]:
    """Add :data:`LINKS` to every 2xx response of their source operations (by ``operationId``)."""
    paths = schema.get("paths", {})
    for (method, path), links in LINKS.items():
        responses = paths[path][method.lower()]["responses"]
        out = {name: {"operationId": paths[target][verb.lower()]["operationId"], "parameters": dict(params)}
               for name, (verb, target, params) in links.items()}
        for status, response in responses.items():
            if status.startswith("2"):
                response["links"] = out
    return schema


def install_error_docs(app: FastAPI) -> None:
    """Make ``app.openapi()`` document each operation's error codes (:func:`document_errors`) and
    its links (:func:`document_links`)."""
    default = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_links(document_errors(default()))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented hook: replace app.openapi
