"""Training runs (admin): start one (budget reserved first), list them, follow one."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import AdminPrincipal, PageQ, SessionDep, SettingsDep, require_sampler_range
from app.api.params import DatasetP, IdP
from app.schemas.admin import TrainingAccepted, TrainingIn, TrainingRunOut
from app.schemas.common import Page
from app.services import admin as admin_svc
from app.services.unit_of_work import commit

router = APIRouter()


@router.post("/admin/datasets/{dataset}/trainings", tags=["admin"], response_model=TrainingAccepted, status_code=202,
             summary="Start a training run (budget reserved now; 409 when it would exceed the cap)",
             description="The run is recorded and its budget reserved in one transaction; it is then sent to the "
                         "workers. With the broker down the answer is still 202 naming the run, with "
                         "`enqueued: false`: the run waits in the outbox and is sent when a worker starts or "
                         "the beat runs. Never resubmit a 202: poll `status_url`.")
def post_training(dataset: DatasetP, body: TrainingIn, admin: AdminPrincipal, session: SessionDep,
                  settings: SettingsDep) -> TrainingAccepted:
    run_id = admin_svc.start_training(session, dataset=dataset, body=body, actor=f"admin:{admin.subject}")
    require_sampler_range(session, run_id)  # 422 rolls the reservation back: nothing is charged
    commit(session)  # the unit of work, committed here: the answer says whether the enqueue after it worked
    sent = admin_svc.enqueue(run_id, settings)
    return TrainingAccepted(run_id=run_id, status="queued", status_url=f"/v1/admin/trainings/{run_id}", enqueued=sent)


@router.get("/admin/datasets/{dataset}/trainings", tags=["admin"], response_model=Page[TrainingRunOut], summary="Training runs")
def list_trainings(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[TrainingRunOut]:
    return admin_svc.runs_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/admin/trainings/{run_id}", tags=["admin"], response_model=TrainingRunOut,
            summary="Training run status and progress")
def get_training(run_id: IdP, _: AdminPrincipal, session: SessionDep) -> TrainingRunOut:
    return admin_svc.run_view(session, run_id=run_id)
