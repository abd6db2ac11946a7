"""Bodies of the public (published-model) and privileged (recommendation) routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from app.schemas.common import ExternalId, Label, StrictModel, UtcDateTime

__all__ = [
    "MAX_N",
    "MAX_RANKED_ITEMS",
    "RecommendationQuery",
    "ScoredItem",
    "RecommendationsOut",
    "ModelInfoOut",
    "EmbeddingRow",
    "EmbeddingsPage",
    "SimilarOut",
    "PopularItem",
    "PopularOut",
]

MAX_N = 1000
MAX_RANKED_ITEMS = 500


class RecommendationQuery(StrictModel):
    n: int = Field(default=10, ge=1, le=MAX_N, description="How many items to return.")
    categories: list[Label] | None = Field(
        default=None, max_length=64,
        description="Only items whose public categories intersect this list.")
    exclude: list[ExternalId] = Field(
        default_factory=list, max_length=10_000, description="Item ids never to return.")
    items: list[ExternalId] | None = Field(
        default=None, min_length=1, max_length=MAX_RANKED_ITEMS,
        description=("Personalised ranking of a given list: return exactly these items (distinct ids "
                     "of the active model), ranked for the user, each with its score; `n`, "
                     "`categories` and `exclude` are then ignored. Unknown ids: 422 naming them."))

    @field_validator("items")
    @classmethod
    def _distinct(cls, items: list[str] | None) -> list[str] | None:
        if items is not None and len(set(items)) != len(items):
            raise ValueError("items must be distinct")
        return items


class ScoredItem(BaseModel):
    item_id: str
    score: float | None = Field(description=(
        "The item's score for this user; its meaning is the response's `score_kind`. Null only in "
        "a popularity fallback of a model that has no baseline score."))
    rank: int
    baseline: bool = Field(default=False, description=(
        "True when the item is outside the trained set: its score is the baseline prediction "
        "(DP mean + the user's offset + the item's DP bias), with no personal factor term."))
    dp_count: float | None = Field(default=None, description=(
        "The item's DP-noisy count: given in a popularity fallback, whose order it decides (null for "
        "one-bit, which releases no counts and orders by mean P(thumbs up))."))


class RecommendationsOut(BaseModel):
    user_id: str
    model_version: int | None = Field(description="Version of the published model used; null when none is published.")
    algorithm: str | None
    score_kind: Literal["predicted_rating", "ranking_score", "p_thumbs_up"] = Field(description=(
        "What `score` is: `predicted_rating` (on the data set's rating scale, always inside its "
        "range), `ranking_score` (ranking objective: higher is better, no scale) or "
        "`p_thumbs_up` (one-bit models: probability of a thumbs up)."))
    fallback: bool = Field(description="True when the DP-popular fallback was served instead of personal scores.")
    fallback_reason: str | None = None
    notes: list[str] = Field(default_factory=list, description=(
        "Why the list may be shorter than asked, e.g. a requested category that no item carries."))
    items: list[ScoredItem]


class ModelInfoOut(BaseModel):
    model_version: int = Field(description=(
        "The model version's global id: the `model_version` of every serving response and the "
        "`{version_id}` of admin paths."))
    dataset_version: int = Field(description="The version number within this data set: 1, 2, ...")
    version: int = Field(deprecated=True, description=(
        "Deprecated: the same value as `model_version` (the name was ambiguous: admin version lists "
        "called the data set's number `version`). Read `model_version`; this field goes in API v2."))
    dataset: str
    algorithm: str
    epsilon: float | None = Field(description="Epsilon charged for this model (conservative, rounded up).")
    delta: float | None
    epsilon_rdp: float | None = None
    epsilon_pld: float | None = None
    trained_at: UtcDateTime | None
    n_items: int
    n_trained_items: int
    rank: int
    sha256: str
    active: bool
    metrics: dict[str, Any] = Field(default_factory=dict, description="Public (DP) metrics only.")
    privacy: dict[str, Any] = Field(default_factory=dict,
                                    description="Parameters that give epsilon its meaning.")


class EmbeddingRow(BaseModel):
    item_id: str
    trained: bool = Field(description="False for items outside the trained (frequent) set; their vector is zero.")
    vector: list[float]


class EmbeddingsPage(BaseModel):
    model_version: int
    rank: int
    items: list[EmbeddingRow]
    total: int
    offset: int
    limit: int
    next_offset: int | None


class SimilarOut(BaseModel):
    model_version: int
    item_id: ExternalId
    items: list[ScoredItem]


class PopularItem(BaseModel):
    item_id: str
    popularity: float = Field(description="The value the list is ordered by; its meaning is the response's "
                                          "`popularity_kind`.")
    dp_count: float | None = Field(default=None, description=(
        "The DP-noisy count released with the model; null when the model releases no counts (one-bit)."))
    rank: int


class PopularOut(BaseModel):
    model_version: int
    popularity_kind: Literal["dp_count", "mean_p_thumbs_up"] = Field(description=(
        "What `popularity` is: the DP-noisy item count, or (one-bit) the mean predicted P(thumbs up) "
        "over users, a post-processing of the private estimate."))
    items: list[PopularItem]
