"""The API's routers, one module per domain; each is mounted under ``/v1`` (:data:`ROUTERS`)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.routes import budget, datasets, items, models, public_data, ratings, recommendations, tokens, trainings, users, votes

__all__ = ["ROUTERS"]

ROUTERS: tuple[APIRouter, ...] = tuple(module.router for module in (
    recommendations, datasets, budget, trainings, models, items, ratings, users, votes, public_data, tokens))
"""Every ``/v1`` router, in the order the OpenAPI document lists their paths. Requests are matched
against the routes in this order, so the hot serving routes come first."""
