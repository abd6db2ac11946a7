"""Bodies of the public (published-model) and privileged (recommendation) routes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.schemas.common import ExternalId, StrictModel

__all__ = [
    "MAX_N",
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


class RecommendationQuery(StrictModel):
    n: int = Field(default=10, ge=1, le=MAX_N, description="How many items to return.")
    categories: list[str] | None = Field(
        default=None, max_length=64,
        description="Only items whose public categories intersect this list.")
    exclude: list[ExternalId] = Field(
        default_factory=list, max_length=10_000, description="Item ids never to return.")


class ScoredItem(BaseModel):
    item_id: str
    score: float
    rank: int


class RecommendationsOut(BaseModel):
    user_id: str
    model_version: int | None = Field(description="Version of the published model used; null when none is published.")
    algorithm: str | None
    fallback: bool = Field(description="True when the DP-popular fallback was served instead of personal scores.")
    fallback_reason: str | None = None
    items: list[ScoredItem]


class ModelInfoOut(BaseModel):
    version: int
    dataset: str
    algorithm: str
    epsilon: float | None = Field(description="Epsilon charged for this model (conservative, rounded up).")
    delta: float | None
    epsilon_rdp: float | None = None
    epsilon_pld: float | None = None
    trained_at: datetime | None
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
    dp_count: float = Field(description="The DP-noisy count released with the model.")
    rank: int


class PopularOut(BaseModel):
    model_version: int
    items: list[PopularItem]
