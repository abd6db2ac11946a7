"""The one error family of the service: every client-facing failure is a :class:`PrivrecError`.

One class per condition, and the class fixes both the HTTP status and the stable ``code``: a raise
site picks the condition, never a free code string. The status families (:class:`NotFound`,
:class:`Conflict`, ...) cannot be raised themselves. Every condition registers itself in
:data:`ERROR_CODES` (code -> class; the first line of its docstring is its meaning), the one table
that the OpenAPI document, the README table and the tests read.

Services, the ledger and the model store raise these; the API renders each one with a single
handler (``app.api.errors``) as ``{"error": {"code", "message", "details"}}`` with the class's
HTTP status. The module imports nothing from the web, database or queue layers.
"""

from __future__ import annotations

from typing import Any

ERROR_CODES: dict[str, type[PrivrecError]] = {}
"""Every condition's code -> its class (filled as the classes below are defined)."""


class PrivrecError(Exception):
    """Base class: a clear, client-facing error; a condition's class fixes the HTTP status and the code.

    ``details`` is JSON-safe structured context; keyword fields are merged into it."""

    status_code: int = 500
    code: str = ""
    where: str = "api"
    """Who returns it: ``api`` (routes document it per status in the OpenAPI document), ``any route``
    (routing and server failures), ``dashboard``, ``cli``, ``worker``, or ``internal`` (a guard
    against a programming error or an inconsistent database)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return
        if cls.code in ERROR_CODES:
            raise TypeError(f"error code {cls.code!r} is taken by {ERROR_CODES[cls.code].__name__}")
        if not (cls.__doc__ or "").strip():
            raise TypeError(f"{cls.__name__} needs a docstring: its first line is the code's meaning")
        ERROR_CODES[cls.code] = cls

    def __init__(self, message: str, *, details: Any = None, headers: dict[str, str] | None = None,
                 **fields: Any) -> None:
        if "code" not in type(self).__dict__:
            raise TypeError(f"{type(self).__name__} is a family of conditions; raise one of its conditions")
        super().__init__(message)
        self.message = message
        self.details: Any = {**(details or {}), **fields} if fields else details
        self.headers = headers

    def to_dict(self) -> dict[str, Any]:
        """The rendered error body (without the status)."""
        return {"code": self.code, "message": self.message, "details": self.details}


def meaning(error: type[PrivrecError]) -> str:
    """The one-line meaning of a condition (the first line of its docstring)."""
    return (error.__doc__ or "").strip().splitlines()[0]


# ----------------------------------------------------------------------------- status families
class BadRequest(PrivrecError):
    status_code = 400


class Unauthorized(PrivrecError):
    status_code = 401

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kw)


class Forbidden(PrivrecError):
    status_code = 403


class NotFound(PrivrecError):
    status_code = 404


class Conflict(PrivrecError):
    status_code = 409


class PayloadTooLarge(PrivrecError):
    status_code = 413


class Unprocessable(PrivrecError):
    status_code = 422


class InvalidRequest(Unprocessable):
    """A domain rule refuses the request's parameters (after request validation passed)."""


class ServiceUnavailable(PrivrecError):
    status_code = 503


# ----------------------------------------------------------------------------- 400, 405, 500, 503 (handlers)
class MalformedJson(BadRequest):
    """The request body is not valid JSON."""

    code = "malformed_json"


class MethodNotAllowed(PrivrecError):
    """The path exists but not with this method (`Allow` lists its methods)."""

    status_code, code, where = 405, "method_not_allowed", "any route"


class HttpError(PrivrecError):
    """Another HTTP-level refusal by the web framework (the status says which)."""

    status_code, code, where = 400, "http_error", "any route"


class InternalError(PrivrecError):
    """An unexpected server error (a bug; never documented per route)."""

    code, where = "internal_error", "any route"


class WriteConflict(ServiceUnavailable):
    """Concurrent writes kept deadlocking with this one; nothing was written: retry."""

    code = "write_conflict"


class DatabaseUnavailable(ServiceUnavailable):
    """The database is not reachable; retry later."""

    code = "database_unavailable"


# ----------------------------------------------------------------------------- 401, 403
class MissingToken(Unauthorized):
    """No bearer token was sent."""

    code = "missing_token"


class InvalidToken(Unauthorized):
    """The token is malformed, tampered with, or lives longer than allowed."""

    code = "invalid_token"


class TokenExpired(Unauthorized):
    """The token has expired."""

    code = "token_expired"


class TokenRevoked(Unauthorized):
    """The token was revoked by an admin or by signing out."""

    code = "token_revoked"


class NoSession(Unauthorized):
    """No valid dashboard session cookie: sign in first."""

    code, where = "no_session", "dashboard"


class AdminRequired(Forbidden):
    """The route needs an admin token."""

    code = "admin_required"


class WrongSubject(Forbidden):
    """The token may not act for this user."""

    code = "wrong_subject"


class ScopeRequired(Forbidden):
    """The token lacks the scope the route needs (editing items: `ingest` or admin)."""

    code = "scope_required"


class OwnUserRequired(Forbidden):
    """Only the user's own user token may make this choice."""

    code = "own_user_required"


class ClientRandomisationForbidden(Forbidden):
    """Only the user's own token may send a client-randomised vote."""

    code = "client_randomisation_forbidden"


class CsrfFailed(Forbidden):
    """A dashboard write without the session's CSRF token."""

    code, where = "csrf_failed", "dashboard"


# ----------------------------------------------------------------------------- 404
class RouteNotFound(NotFound):
    """No route at this path."""

    code, where = "not_found", "any route"


class UnknownDataset(NotFound):
    """No data set has this name."""

    code = "unknown_dataset"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown data set {name!r}", details={"dataset": name})


class UnknownItem(NotFound):
    """No item has this id in the data set's catalogue."""

    code = "unknown_item"


class ItemNotInModel(NotFound):
    """The item is not in the active model (it was not trained on)."""

    code = "item_not_in_model"


class UnknownUser(NotFound):
    """No user has this id."""

    code = "unknown_user"


class UnknownRating(NotFound):
    """The user has no rating of this item."""

    code = "unknown_rating"


class UnknownVote(NotFound):
    """The user has no vote on this item."""

    code = "unknown_vote"


class UnknownTrainingRun(NotFound):
    """No training run has this id (in this data set)."""

    code = "unknown_training_run"


class UnknownModelVersion(NotFound):
    """The data set has no model version with this id."""

    code = "unknown_model_version"


class NoActiveModel(NotFound):
    """The data set has no published model yet; start a training first."""

    code = "no_active_model"


class UnknownPersonBudget(NotFound):
    """No per-person budget has this name."""

    code = "unknown_person_budget"


class UnknownSimilaritySource(NotFound):
    """The data set has no similarity source with this name."""

    code = "unknown_similarity_source"


class NoBudgetAccount(NotFound):
    """The data set has no budget account (an inconsistent database)."""

    code, where = "no_budget_account", "internal"


# ----------------------------------------------------------------------------- 409
class DatasetExists(Conflict):
    """A data set with this name exists."""

    code = "dataset_exists"


class PersonBudgetExists(Conflict):
    """A per-person budget with this name exists."""

    code = "person_budget_exists"


class PersonBudgetFixed(Conflict):
    """A per-person budget's delta, relation and privacy unit are fixed at creation."""

    code = "person_budget_fixed"


class CapChangeRefused(Conflict):
    """The cap cannot go below what is already spent."""

    code = "cap_change_refused"


class RelationRefused(Conflict):
    """An event's neighbouring relation does not imply the budget account's relation."""

    code = "relation_not_implied"


class PrivacyUnitMismatch(Conflict):
    """A per-person budget holds data sets of one privacy unit; this data set declares the other."""

    code = "privacy_unit_mismatch"


class PrivacyUnitFixed(Conflict):
    """A data set's privacy unit is declared at creation and never changes."""

    code = "privacy_unit_fixed"


class VotesExist(Conflict):
    """The data set holds votes: its vote settings can no longer change."""

    code = "votes_exist"


class VoteCapExceeded(Conflict):
    """A user's vote allowance (votes_per_user_cap) is used up; nothing was written."""

    code = "vote_cap_exceeded"


class IdempotencyKeyReused(Conflict):
    """The idempotency key was used before for a different request body."""

    code = "idempotency_key_reused"


class ArtifactUnreadable(Conflict):
    """The model version's artifact is unreadable or altered."""

    code = "artifact_unreadable"


class ArtifactMissing(Conflict):
    """The model version's artifact is missing; it cannot be activated."""

    code = "artifact_missing"


class RunFinished(Conflict):
    """The training run has already finished (published or failed): it cannot be cancelled."""

    code = "run_finished"


class RunNotRunning(Conflict):
    """The training run is no longer running; its output is not published."""

    code, where = "run_not_running", "worker"


class RunRefunded(Conflict):
    """The training run was refunded: it cannot reserve again or publish."""

    code, where = "run_refunded", "worker"


class RunPublished(Conflict):
    """The training run was published; its charge cannot be refunded."""

    code, where = "run_published", "worker"


class ReservationMismatch(Conflict):
    """The training run already holds a reservation for a different event."""

    code, where = "reservation_mismatch", "worker"


class NoReservation(Conflict):
    """The training run has no reservation to commit."""

    code, where = "no_reservation", "worker"


class BudgetExceeded(Conflict):
    """The run or guarantee would exceed the data set's privacy budget cap.

    Prior spend, request and cap stated apart (public numbers only)."""

    code = "budget_exceeded"

    def __init__(self, *, dataset: str, prior_spent_epsilon: float, requested_epsilon: float,
                 would_spend_epsilon: float, epsilon_cap: float, delta: float, **scope: str) -> None:
        super().__init__(
            f"{self._subject(dataset, **scope)} exceeded: already spent epsilon {prior_spent_epsilon}, "
            f"this request needs epsilon {requested_epsilon} on its own, composed total would be "
            f"{would_spend_epsilon} > cap {epsilon_cap} (delta {delta})",
            details={"dataset": dataset, **scope, "prior_spent_epsilon": prior_spent_epsilon,
                     "requested_epsilon": requested_epsilon, "would_spend_epsilon": would_spend_epsilon,
                     "epsilon_cap": epsilon_cap, "delta": delta})

    @staticmethod
    def _subject(dataset: str, **scope: str) -> str:
        return f"privacy budget of data set {dataset!r}"


class PersonBudgetExceeded(BudgetExceeded):
    """The run or guarantee would exceed the per-person budget cap.

    The events of every data set that can hold the same person, composed, would pass the person
    budget's cap (public numbers only)."""

    code = "person_budget_exceeded"

    def __init__(self, *, person_budget: str, **figures: Any) -> None:
        super().__init__(person_budget=person_budget, **figures)

    @staticmethod
    def _subject(dataset: str, **scope: str) -> str:
        return f"per-person budget {scope['person_budget']!r} (data set {dataset!r} counts against it)"


# ----------------------------------------------------------------------------- 413
class BodyTooLarge(PayloadTooLarge):
    """The request body exceeds the size limit."""

    code = "body_too_large"


class BatchTooLarge(PayloadTooLarge):
    """A batch holds more rows (or neighbour pairs) than allowed; nothing was written."""

    code = "batch_too_large"


# ----------------------------------------------------------------------------- 422
class ValidationFailed(Unprocessable):
    """The request does not match the route's schema (types, bounds, patterns)."""

    code = "validation_error"


class InvalidRows(Unprocessable):
    """Some rows of a batch are invalid (listed per row); nothing was written."""

    code = "invalid_rows"


class UnknownItems(Unprocessable):
    """A batch names items that are not in the data set's catalogue; nothing was written."""

    code, where = "unknown_items", "cli"


class ItemsNotInModel(Unprocessable):
    """Item ids given to rank are not in the active model."""

    code = "items_not_in_model"


class RatingOutOfRange(Unprocessable):
    """The rating is not a finite number inside the data set's rating range."""

    code = "rating_out_of_range"


class InvalidItemId(Unprocessable):
    """An item id does not have 1 to 128 characters; nothing was written."""

    code, where = "invalid_item_id", "cli"


class CapRequired(Unprocessable):
    """Randomisation at ingestion needs votes_per_user_cap."""

    code = "cap_required"


class RandomisedNotAccepted(Unprocessable):
    """The data set stores raw votes: a client-randomised vote is not accepted."""

    code = "randomised_not_accepted"


class LocalEpsilonMismatch(Unprocessable):
    """A client-randomised vote used another epsilon0 than the data set's."""

    code = "local_epsilon_mismatch"


class PrivacyUnitNotSupported(Unprocessable):
    """Votes are accounted per user (allowance, local guarantee): no user_period unit for them."""

    code = "privacy_unit_not_supported"


class InvalidSourceName(Unprocessable):
    """A similarity source name does not have 1-64 characters of [A-Za-z0-9_-]."""

    code = "invalid_source_name"


class NotDeclaredPublic(Unprocessable):
    """A similarity source must declare that it is public data."""

    code = "not_declared_public"


class ProvenanceRequired(Unprocessable):
    """A similarity source needs a provenance (URL or citation)."""

    code = "provenance_required"


class UnknownAlgorithm(InvalidRequest):
    """No training algorithm has this name."""

    code = "unknown_algorithm"


class SecretHyperparameter(InvalidRequest):
    """A hyper-parameter the service draws secretly per run was chosen."""

    code = "secret_hyperparameter"


class InvalidHyperparameters(InvalidRequest):
    """The algorithm's hyper-parameters (or objective) are invalid for this run or data set."""

    code = "invalid_hyperparameters"


class CatalogueTooSmall(InvalidRequest):
    """The data set's public catalogue has too few items for the algorithm."""

    code = "catalogue_too_small"


class InvalidEpsilon(InvalidRequest):
    """The run's epsilon or epsilon_fraction is missing, doubled or out of range."""

    code = "invalid_epsilon"


class CalibrationFailed(InvalidRequest):
    """The algorithm cannot be calibrated to this epsilon."""

    code = "calibration_failed"


class InvalidIdempotencyKey(InvalidRequest):
    """The idempotency key does not have 1 to 128 characters."""

    code = "invalid_idempotency_key"


class VoteSettingsChanged(InvalidRequest):
    """The data set no longer randomises votes with this epsilon0: a free run cannot train on them."""

    code, where = "vote_settings_changed", "worker"


class InvalidPage(InvalidRequest):
    """offset must be >= 0 and limit >= 1."""

    code, where = "invalid_page", "internal"


class InvalidDatasetName(InvalidRequest):
    """A data set name must have 1 to 64 characters."""

    code = "invalid_dataset_name"


class InvalidRatingRange(InvalidRequest):
    """rating_min must be below rating_max."""

    code = "invalid_rating_range"


class InvalidEpsilonCap(InvalidRequest):
    """An epsilon cap must be a finite number > 0."""

    code = "invalid_epsilon_cap"


class InvalidRetrainPolicy(InvalidRequest):
    """A retrain policy value is out of its bounds."""

    code = "invalid_retrain_policy"


class InvalidDelta(InvalidRequest):
    """delta must lie strictly between 0 and 1."""

    code = "invalid_delta"


class InvalidRelation(InvalidRequest):
    """Unknown neighbouring relation."""

    code = "invalid_relation"


class ReasonRequired(InvalidRequest):
    """Raising a privacy budget cap requires a reason."""

    code = "reason_required"


class DeltaRequired(InvalidRequest):
    """A new per-person budget needs a delta."""

    code = "delta_required"


class InvalidPersonBudgetName(InvalidRequest):
    """A per-person budget name must have 1 to 64 characters."""

    code = "invalid_person_budget_name"


class PersonBudgetMissing(InvalidRequest):
    """The data set names a per-person budget that does not exist; create it first."""

    code = "person_budget_missing"


_FAMILIES: tuple[type[PrivrecError], ...] = (
    PrivrecError, BadRequest, Unauthorized, Forbidden, NotFound, Conflict, PayloadTooLarge, Unprocessable,
    InvalidRequest, ServiceUnavailable)
__all__ = ["ERROR_CODES", "meaning", *sorted(cls.__name__ for cls in (*_FAMILIES, *ERROR_CODES.values()))]
