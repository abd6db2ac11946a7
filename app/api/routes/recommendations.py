"""Serving: a user's recommendations (that user or a service acting for users), similar items and DP-
popular items (anyone)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from app.api.deps import CurrentPrincipal, SessionDep, require_user_access, run_in_app_session
from app.api.errors import validation_details
from app.api.params import DatasetP, ItemP, UserP
from app.errors import ValidationFailed
from app.schemas.common import ExternalId
from app.schemas.serving import MAX_N, PopularOut, RecommendationQuery, RecommendationsOut, SimilarOut
from app.services.serving import popular, recommend, similar

router = APIRouter()

RECO_DESCRIPTION = (
    "Scores every item of the active model for this user from the published item embeddings "
    "plus this user's own data only: their ratings (closed-form least squares; DPFW replays the "
    "published steps) or, for a one-bit model, their own stored votes (regularised logistic "
    "regression; scores are P(thumbs up)). Excludes items the user already rated or voted on, "
    "the `exclude` list and items outside `categories`, and returns the top `n` with the "
    "model version. A user with no usable ratings or votes receives the DP-popular fallback "
    "(`fallback: true`). Per-user scoring is post-processing of the public model and is not "
    "charged to the privacy budget."
)


GET_QUERY = frozenset({"n", "category", "exclude"})
"""The query parameters the GET form takes; anything else (e.g. ``items``) is refused."""


async def known_query_only(request: Request) -> None:
    """422 ``validation_error`` for a query parameter the GET form does not take, naming the POST
    form (which takes every filter in its body), so a misspelt or POST-only filter is never
    silently ignored."""
    unknown = sorted(set(request.query_params) - GET_QUERY)
    if unknown:
        raise ValidationFailed(
            "unknown query parameter: GET takes only n, category and exclude; send other fields (e.g. "
            "items) in the JSON body of POST /v1/datasets/{dataset}/users/{user_id}/recommendations",
            details=validation_details([{"loc": ("query", name), "type": "extra_forbidden",
                                         "msg": "unknown query parameter; use the POST form"} for name in unknown]))


@router.get("/datasets/{dataset}/users/{user_id}/recommendations", tags=["privileged"], response_model=RecommendationsOut,
            summary="Top-N recommendations for the user",
            description=RECO_DESCRIPTION + " Unknown query parameters are refused (422) rather than ignored; "
            "filters the GET form lacks go in the body of the POST form.",
            dependencies=[Depends(known_query_only)])
async def get_recommendations(
    request: Request, dataset: DatasetP, user_id: UserP, principal: CurrentPrincipal,
    n: Annotated[int, Query(ge=1, le=MAX_N)] = 10,
    category: Annotated[list[str] | None, Query(max_length=64, description="Repeatable category filter.")] = None,
    exclude: Annotated[list[ExternalId] | None, Query(max_length=1000, description="Repeatable item id to exclude.")] = None,
) -> Response:
    require_user_access(principal, user_id)
    query = RecommendationQuery(n=n, categories=category, exclude=exclude or [])
    return await recommendations_response(request.app, dataset, user_id, query)


@router.post("/datasets/{dataset}/users/{user_id}/recommendations", tags=["privileged"], response_model=RecommendationsOut,
             summary="Top-N recommendations for the user (filters in the body)",
             description=RECO_DESCRIPTION)
async def post_recommendations(request: Request, dataset: DatasetP, user_id: UserP, body: RecommendationQuery,
                               principal: CurrentPrincipal) -> Response:
    require_user_access(principal, user_id)
    return await recommendations_response(request.app, dataset, user_id, body)


async def recommendations_response(app: Any, dataset: str, user_id: str, query: RecommendationQuery) -> Response:
    """The response of both recommendation routes (and of :mod:`app.api.fast_path`) for a caller
    already allowed to act for ``user_id``, as JSON: on the event loop when the one read is all
    the I/O it needs (PostgreSQL, warm caches), else the service in one worker thread."""
    out = await recommend.recommend_on_loop(app.state.sessionmaker.kw.get("bind"), app.state.settings.db_pool_size,
                                            dataset=dataset, user_id=user_id, query=query)
    if out is None:
        out = await run_in_app_session(
            app, lambda s: recommend.recommend_for_user(s, dataset=dataset, user_id=user_id, query=query))
    return _json(out)


def _json(out: RecommendationsOut) -> Response:
    """Serialised once (pydantic-core): a returned model would be validated again against
    ``response_model`` before the same serialisation."""
    return Response(content=out.model_dump_json(), media_type="application/json")


NQ = Annotated[int, Query(ge=1, le=MAX_N, description="How many items to return.")]


@router.get("/datasets/{dataset}/items/{item_id}/similar", tags=["public"], response_model=SimilarOut,
            summary="Items similar to one item (cosine on public embeddings)")
def get_similar(dataset: DatasetP, item_id: ItemP, session: SessionDep, n: NQ = 10) -> SimilarOut:
    return similar.similar(session, dataset=dataset, item_id=item_id, n=n)


@router.get("/datasets/{dataset}/popular", tags=["public"], response_model=PopularOut,
            summary="Most popular items by the DP counts released with the model")
def get_popular(dataset: DatasetP, session: SessionDep, n: NQ = 10) -> PopularOut:
    return popular.popular(session, dataset=dataset, n=n)
