"""Model versions: the active model's public outputs (metadata, item embeddings) and the admin's
version list and rollback."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import AdminPrincipal, PageQ, SessionDep, WriteSessionDep
from app.api.params import DatasetP, IdP
from app.schemas.admin import ModelVersionOut
from app.schemas.common import Page
from app.schemas.serving import EmbeddingsPage, ModelInfoOut
from app.services import admin as admin_svc
from app.services.serving import published

router = APIRouter()


@router.get("/datasets/{dataset}/model", tags=["public"], response_model=ModelInfoOut,
            summary="Metadata of the active published model")
def get_model(dataset: DatasetP, session: SessionDep) -> ModelInfoOut:
    return published.model_info(session, dataset=dataset)


@router.get("/datasets/{dataset}/model/embeddings", tags=["public"], response_model=EmbeddingsPage,
            summary="Item embeddings of the active model, paged")
def get_embeddings(dataset: DatasetP, session: SessionDep, page: PageQ) -> EmbeddingsPage:
    return published.embeddings_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/datasets/{dataset}/model/embeddings.npy", tags=["public"],
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


@router.get("/admin/datasets/{dataset}/models", tags=["admin"], response_model=Page[ModelVersionOut], summary="Model versions")
def list_models(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[ModelVersionOut]:
    return admin_svc.versions_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.post("/admin/datasets/{dataset}/models/{version_id}/activate", tags=["admin"], response_model=ModelVersionOut,
             summary="Activate a model version and pin it (a rollback that sticks)",
             description="The version stays active until `POST .../models/unpin`: runs (scheduled or manual) "
                         "still publish their versions, inactive, while it is pinned.")
def activate_model(dataset: DatasetP, version_id: IdP, admin: AdminPrincipal, session: WriteSessionDep) -> ModelVersionOut:
    return admin_svc.activate(session, dataset=dataset, version_id=version_id, actor=f"admin:{admin.subject}")


@router.post("/admin/datasets/{dataset}/models/unpin", tags=["admin"], response_model=ModelVersionOut,
             summary="Unpin the active model version and activate the newest one",
             description="Publications activate their versions again. Idempotent; 404 `no_active_model` "
                         "when nothing is published.")
def unpin_model(dataset: DatasetP, admin: AdminPrincipal, session: WriteSessionDep) -> ModelVersionOut:
    return admin_svc.unpin(session, dataset=dataset, actor=f"admin:{admin.subject}")
