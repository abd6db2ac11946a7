"""The one error family of the service: every client-facing failure is a :class:`PrivrecError`.

Services, the ledger and the model store raise these; the API renders each one with a single
handler (``app.api.errors``) as ``{"error": {"code", "message", "details"}}`` with the class's
HTTP status. The module imports nothing from the web, database or queue layers.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PrivrecError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "Unprocessable",
    "InvalidRequest",
    "ServiceUnavailable",
    "BudgetExceeded",
    "PersonBudgetExceeded",
    "CapChangeRefused",
    "RelationRefused",
    "NoActiveModel",
]


class PrivrecError(Exception):
    """Base class: a clear, client-facing error; subclasses fix the HTTP status and the code.

    ``details`` is JSON-safe structured context; keyword fields are merged into it."""

    status_code: int = 400
    code: str = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, details: Any = None,
                 headers: dict[str, str] | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details: Any = {**(details or {}), **fields} if fields else details
        self.headers = headers

    def to_dict(self) -> dict[str, Any]:
        """The rendered error body (without the status)."""
        return {"code": self.code, "message": self.message, "details": self.details}


class BadRequest(PrivrecError):
    status_code, code = 400, "bad_request"


class Unauthorized(PrivrecError):
    status_code, code = 401, "unauthorized"

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kw)


class Forbidden(PrivrecError):
    status_code, code = 403, "forbidden"


class NotFound(PrivrecError):
    status_code, code = 404, "not_found"


class Conflict(PrivrecError):
    status_code, code = 409, "conflict"


class PayloadTooLarge(PrivrecError):
    status_code, code = 413, "payload_too_large"


class Unprocessable(PrivrecError):
    status_code, code = 422, "validation_error"


class InvalidRequest(Unprocessable):
    code = "invalid_request"


class ServiceUnavailable(PrivrecError):
    status_code, code = 503, "unavailable"


class NoActiveModel(NotFound):
    code = "no_active_model"


class CapChangeRefused(Conflict):
    code = "cap_change_refused"


class RelationRefused(Conflict):
    """An event whose neighbouring relation does not imply the budget account's relation."""

    code = "relation_not_implied"


class BudgetExceeded(Conflict):
    """The composed privacy loss would exceed a data set's cap; prior spend, request and cap stated
    apart (public numbers only)."""

    code = "budget_exceeded"

    def __init__(self, *, dataset: str, prior_spent_epsilon: float, requested_epsilon: float,
                 would_spend_epsilon: float, epsilon_cap: float, delta: float, **scope: str) -> None:
        super().__init__(
            f"{self._subject(dataset, **scope)} exceeded: already spent epsilon {prior_spent_epsilon}, "
            f"this request needs epsilon {requested_epsilon} on its own, composed total would be "
            f"{would_spend_epsilon} > cap {epsilon_cap} (delta {delta})",
            dataset=dataset, **scope, prior_spent_epsilon=prior_spent_epsilon,
            requested_epsilon=requested_epsilon, would_spend_epsilon=would_spend_epsilon,
            epsilon_cap=epsilon_cap, delta=delta)

    @staticmethod
    def _subject(dataset: str, **scope: str) -> str:
        return f"privacy budget of data set {dataset!r}"


class PersonBudgetExceeded(BudgetExceeded):
    """The per-person bound would be exceeded: the events of every data set that can hold the same
    person, composed, would pass the person budget's cap (public numbers only)."""

    code = "person_budget_exceeded"

    def __init__(self, *, person_budget: str, **figures: Any) -> None:
        super().__init__(person_budget=person_budget, **figures)

    @staticmethod
    def _subject(dataset: str, **scope: str) -> str:
        return f"per-person budget {scope['person_budget']!r} (data set {dataset!r} counts against it)"
