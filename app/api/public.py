"""Public routes: DP outputs of the active model and the public item catalogue (no token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from app.api.deps import PageQ, SessionDep
from app.api.params import DatasetP, ItemP
from app.schemas.common import Page
from app.schemas.ingest import ItemOut
from app.schemas.serving import MAX_N, EmbeddingsPage, ModelInfoOut, PopularOut, SimilarOut
from app.services import catalog
from app.services.serving import popular, published, similar

router = APIRouter(tags=["public"])

NQ = Annotated[int, Query(ge=1, le=MAX_N, description="How many items to return.")]


@router.get("/datasets/{dataset}/items", response_model=Page[ItemOut], summary="List items")
def list_items(dataset: DatasetP, session: SessionDep, page: PageQ) -> Page[ItemOut]:
    return catalog.list_items(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/datasets/{dataset}/items/{item_id}", response_model=ItemOut, summary="One item")
def get_item(dataset: DatasetP, item_id: ItemP, session: SessionDep) -> ItemOut:
    return catalog.get_item(session, dataset=dataset, item_id=item_id)


@router.get("/datasets/{dataset}/model", response_model=ModelInfoOut,
            summary="Metadata of the active published model")
def get_model(dataset: DatasetP, session: SessionDep) -> ModelInfoOut:
    return published.model_info(session, dataset=dataset)


@router.get("/datasets/{dataset}/model/embeddings", response_model=EmbeddingsPage,
            summary="Item embeddings of the active model, paged")
def get_embeddings(dataset: DatasetP, session: SessionDep, page: PageQ) -> EmbeddingsPage:
    return published.embeddings_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get(
    "/datasets/{dataset}/model/embeddings.npy",
    summary="Item embeddings of the active model as one .npy array",
    description="A float32 array of shape (n_items, rank), rows in the order of "
    "`/model/embeddings`; the `X-Model-Version` header names the version and "
    "`X-Item-Ids-Url` where the row ids are.",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "NumPy .npy file"}},
)
def get_embeddings_npy(dataset: DatasetP, session: SessionDep) -> Response:
    data, version = published.embeddings_npy(session, dataset=dataset)
    return Response(
        content=data,
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="{dataset}-v{version}-item-embeddings.npy"',
            "X-Model-Version": str(version),
            "X-Item-Ids-Url": f"/v1/datasets/{dataset}/model/embeddings",
        },
    )


@router.get("/datasets/{dataset}/items/{item_id}/similar", response_model=SimilarOut,
            summary="Items similar to one item (cosine on public embeddings)")
def get_similar(dataset: DatasetP, item_id: ItemP, session: SessionDep, n: NQ = 10) -> SimilarOut:
    return similar.similar(session, dataset=dataset, item_id=item_id, n=n)


@router.get("/datasets/{dataset}/popular", response_model=PopularOut,
            summary="Most popular items by the DP counts released with the model")
def get_popular(dataset: DatasetP, session: SessionDep, n: NQ = 10) -> PopularOut:
    return popular.popular(session, dataset=dataset, n=n)
