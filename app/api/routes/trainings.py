"""Training runs (admin): start one (budget reserved first), list them, follow one, cancel one."""

from __future__ import annotations

import logging

from fastapi import APIRouter

from app.api.deps import AdminPrincipal, PageQ, SessionDep, SettingsDep, WriteSessionDep
from app.api.params import DatasetP, IdP
from app.config import Settings
from app.schemas.admin import TrainingAccepted, TrainingIn, TrainingRunOut
from app.schemas.common import Page
from app.services import admin as admin_svc
from app.services.training.requests import RETRY_WINDOW_S
from app.services.unit_of_work import commit

log = logging.getLogger(__name__)

router = APIRouter()


@router.post("/admin/datasets/{dataset}/trainings", tags=["admin"], response_model=TrainingAccepted, status_code=202,
             summary="Start a training run (budget reserved now; 409 when it would exceed the cap)",
             description="The run is recorded and its budget reserved in one transaction; it is then sent to the "
                         "workers. With the broker down the answer is still 202 naming the run, with "
                         "`enqueued: false`: the run waits in the outbox and is sent when a worker starts or "
                         "the beat runs. Never resubmit a 202: poll `status_url`. A replay (the same "
                         "`idempotency_key`, or without one the same admin's identical request within "
                         f"{RETRY_WINDOW_S:.0f} s) answers 202 with the earlier run and its current status; "
                         "a key replayed with another body is 409 `idempotency_key_reused`.")
def post_training(dataset: DatasetP, body: TrainingIn, admin: AdminPrincipal, session: SessionDep,
                  settings: SettingsDep) -> TrainingAccepted:
    run_id = admin_svc.start_training(session, dataset=dataset, body=body, actor=f"admin:{admin.subject}")
    run = admin_svc.run_view(session, run_id=run_id)  # on the request's connection: a replay's true status
    commit(session)  # the unit of work, committed here: the run is charged from now on
    return _accepted(run, settings)


def _accepted(run: TrainingRunOut, settings: Settings) -> TrainingAccepted:
    """The answer for a committed (charged) run, which never fails: a broker or database fault
    while sending leaves the run in the outbox (``enqueued: false``), which sends it later. It
    runs inside the request's transaction slot (:mod:`app.api.deps`), so marking the run
    enqueued does not queue behind other requests for SQLite's write lock or the pool."""
    sent = run.enqueued
    if run.status == "queued" and not sent:
        try:
            sent = admin_svc.enqueue(run.id, settings)
        except Exception as exc:  # noqa: BLE001 - the run is charged: answer for it, the outbox sends it
            log.warning("run %s left to the outbox: sending failed (%s)", run.id, type(exc).__name__)
            sent = False
    return TrainingAccepted(run_id=run.id, status=run.status, status_url=f"/v1/admin/trainings/{run.id}",
                            enqueued=sent)


@router.get("/admin/datasets/{dataset}/trainings", tags=["admin"], response_model=Page[TrainingRunOut], summary="Training runs")
def list_trainings(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[TrainingRunOut]:
    return admin_svc.runs_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.post("/admin/trainings/{run_id}/cancel", tags=["admin"], response_model=TrainingRunOut,
             summary="Cancel a queued or running training run (charged if it had read private data)",
             description="The run ends `failed` at stage `cancelled` and publishes nothing; a worker "
                         "training it stops at its next progress or heartbeat point. A run that had not "
                         "read private data is refunded; one that had (`private_data_read`) stays "
                         "charged, never refunded. Cancelling a cancelled run answers it again; a run "
                         "that already succeeded or failed is 409 `run_finished`.")
def cancel_training(run_id: IdP, admin: AdminPrincipal, session: WriteSessionDep) -> TrainingRunOut:
    return admin_svc.cancel_training(session, run_id=run_id, actor=f"admin:{admin.subject}")


@router.get("/admin/trainings/{run_id}", tags=["admin"], response_model=TrainingRunOut,
            summary="Training run status and progress")
def get_training(run_id: IdP, _: AdminPrincipal, session: SessionDep) -> TrainingRunOut:
    return admin_svc.run_view(session, run_id=run_id)
