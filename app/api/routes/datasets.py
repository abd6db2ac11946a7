"""Data sets (admin): create, change the declared kind or bound on users, list."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import AdminPrincipal, PageQ, SessionDep, WriteSessionDep
from app.api.params import DatasetP
from app.schemas.admin import DatasetIn, DatasetOut, DatasetPatchIn
from app.schemas.common import Page
from app.services import admin as admin_svc

router = APIRouter()


@router.post("/admin/datasets", tags=["admin"], response_model=DatasetOut, status_code=201,
             summary="Create a data set with its own privacy budget")
def post_dataset(body: DatasetIn, admin: AdminPrincipal, session: WriteSessionDep) -> DatasetOut:
    return admin_svc.create_dataset(session, body=body, actor=f"admin:{admin.subject}")


@router.patch("/admin/datasets/{dataset}", tags=["admin"], response_model=DatasetOut,
              summary="Change a data set's declared kind or its public bound on users (max_users)")
def patch_dataset(dataset: DatasetP, body: DatasetPatchIn, _: AdminPrincipal, session: WriteSessionDep) -> DatasetOut:
    return admin_svc.update_dataset(session, dataset=dataset, body=body)


@router.get("/admin/datasets", tags=["admin"], response_model=Page[DatasetOut], summary="Data sets and their budgets")
def list_datasets(_: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[DatasetOut]:
    return admin_svc.datasets_page(session, offset=page.offset, limit=page.limit)
