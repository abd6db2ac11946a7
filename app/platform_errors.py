"""Errors raised by the platform services; each carries the HTTP status it maps to.

The API renders every ``PlatformError`` with one handler: ``status_code``, ``code``,
``message`` and ``details`` (JSON-safe).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PlatformError",
    "NotFound",
    "InvalidRequest",
    "Conflict",
    "BudgetExceeded",
    "CapChangeRefused",
    "RelationRefused",
    "PersonBudgetExceeded",
    "NoActiveModel",
]


class PlatformError(Exception):
    """Base class: a clear, client-facing error."""

    status_code = 400
    code = "platform_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class NotFound(PlatformError):
    status_code = 404
    code = "not_found"


class InvalidRequest(PlatformError):
    status_code = 422
    code = "invalid_request"


class Conflict(PlatformError):
    status_code = 409
    code = "conflict"


class BudgetExceeded(Conflict):
    """The composed privacy loss would exceed the cap; prior spend, request and cap stated apart."""

    code = "budget_exceeded"

    def __init__(
        self,
        *,
        dataset: str,
        prior_spent_epsilon: float,
        requested_epsilon: float,
        would_spend_epsilon: float,
        epsilon_cap: float,
        delta: float,
    ) -> None:
        super().__init__(
            f"privacy budget of data set {dataset!r} exceeded: already spent epsilon "
            f"{prior_spent_epsilon}, this request needs epsilon {requested_epsilon} on its own, "
            f"composed total would be {would_spend_epsilon} > cap {epsilon_cap} (delta {delta})",
            dataset=dataset,
            prior_spent_epsilon=prior_spent_epsilon,
            requested_epsilon=requested_epsilon,
            would_spend_epsilon=would_spend_epsilon,
            epsilon_cap=epsilon_cap,
            delta=delta,
        )


class CapChangeRefused(Conflict):
    code = "cap_change_refused"


class NoActiveModel(NotFound):
    code = "no_active_model"


class RelationRefused(Conflict):
    """An event whose neighbouring relation does not imply the budget account's relation."""

    code = "relation_not_implied"


class PersonBudgetExceeded(BudgetExceeded):
    """The per-person bound would be exceeded: the events of every data set that can hold the same
    person, composed, would pass the person budget's cap (public numbers only)."""

    code = "person_budget_exceeded"

    def __init__(
        self,
        *,
        dataset: str,
        person_budget: str,
        prior_spent_epsilon: float,
        requested_epsilon: float,
        would_spend_epsilon: float,
        epsilon_cap: float,
        delta: float,
    ) -> None:
        Conflict.__init__(
            self,
            f"per-person budget {person_budget!r} (data set {dataset!r} counts against it) exceeded: "
            f"already spent epsilon {prior_spent_epsilon}, this request needs epsilon {requested_epsilon} "
            f"on its own, composed total would be {would_spend_epsilon} > cap {epsilon_cap} (delta {delta})",
            dataset=dataset,
            person_budget=person_budget,
            prior_spent_epsilon=prior_spent_epsilon,
            requested_epsilon=requested_epsilon,
            would_spend_epsilon=would_spend_epsilon,
            epsilon_cap=epsilon_cap,
            delta=delta,
        )
