"""Admin routes (admin token): privacy budget, ledger, trainings, model versions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import AdminPrincipal, PageQ, SessionDep, SettingsDep, WriteSessionDep
from app.api.params import DatasetP
from app.schemas.admin import (MAX_EPSILON_CAP, PERSON_BUDGET_NAME, BudgetOut, CapChangeIn, DatasetIn, DatasetOut,
                               DatasetPatchIn, LedgerEntryOut, ModelVersionOut, PersonBudgetIn, PersonBudgetOut,
                               ProjectionOut, TrainingAccepted, TrainingIn, TrainingRunOut)
from app.schemas.common import Page
from app.services import admin as svc
from app.services.unit_of_work import commit

router = APIRouter(tags=["admin"])

IdP = Annotated[int, Path(ge=1, le=2**31 - 1, description="Numeric id (a 32-bit database key).")]
PersonBudgetP = Annotated[str, Path(min_length=1, max_length=64, pattern=PERSON_BUDGET_NAME,
                                    description="Per-person budget name, e.g. `all`.")]


@router.post("/datasets", response_model=DatasetOut, status_code=201,
             summary="Create a data set with its own privacy budget")
def post_dataset(body: DatasetIn, admin: AdminPrincipal, session: WriteSessionDep) -> DatasetOut:
    return svc.create_dataset(session, body=body, actor=f"admin:{admin.subject}")


@router.patch("/datasets/{dataset}", response_model=DatasetOut,
              summary="Change a data set's declared kind or its public bound on users (max_users)")
def patch_dataset(dataset: DatasetP, body: DatasetPatchIn, _: AdminPrincipal, session: WriteSessionDep) -> DatasetOut:
    return svc.update_dataset(session, dataset=dataset, body=body)


@router.get("/datasets", response_model=Page[DatasetOut], summary="Data sets and their budgets")
def list_datasets(_: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[DatasetOut]:
    return svc.datasets_page(session, offset=page.offset, limit=page.limit)


@router.get("/datasets/{dataset}/budget", response_model=BudgetOut, summary="Privacy budget")
def get_budget(dataset: DatasetP, _: AdminPrincipal, session: SessionDep) -> BudgetOut:
    return svc.budget_view(session, dataset=dataset)


@router.get("/datasets/{dataset}/budget/projection", response_model=ProjectionOut,
            summary="What a run at epsilon would compose to, and how many such runs are affordable",
            description=("Composes the ledger's charged events with the event of one more run at `epsilon` "
                         "(the active model's algorithm and public hyper-parameters unless `algorithm` is "
                         "given), by the RDP accountant at the budget's delta, PLD beside it. Composition is "
                         "not additive: `remaining_epsilon` does not answer this."))
def get_projection(dataset: DatasetP, _: AdminPrincipal, session: SessionDep,
                   epsilon: Annotated[float, Query(ge=1e-3, le=MAX_EPSILON_CAP, description="The run's epsilon.")],
                   algorithm: Annotated[str | None, Query(max_length=32, pattern=r"^[a-z0-9_\-]+$")] = None) -> ProjectionOut:
    return svc.projection(session, dataset=dataset, epsilon=epsilon, algorithm=algorithm)


@router.patch("/datasets/{dataset}/budget", response_model=BudgetOut,
              summary="Change the epsilon cap (audited)",
              description="Raising the cap needs a `reason`; lowering it below what is spent is refused (409).")
def patch_budget(dataset: DatasetP, body: CapChangeIn, admin: AdminPrincipal, session: WriteSessionDep) -> BudgetOut:
    return svc.change_cap(session, dataset=dataset, epsilon_cap=body.epsilon_cap, reason=body.reason,
                         actor=f"admin:{admin.subject}")


@router.get("/person-budgets/{name}", response_model=PersonBudgetOut, summary="Per-person budget")
def get_person_budget(name: PersonBudgetP, _: AdminPrincipal, session: SessionDep) -> PersonBudgetOut:
    return svc.person_budget_view(session, name=name)


@router.put("/person-budgets/{name}", response_model=PersonBudgetOut,
            summary="Create a per-person budget or change its cap (audited)",
            description="The events of every data set naming it are composed against its cap in the same "
                        "locked reservation as the data set's own cap. Raising the cap needs a `reason`; "
                        "lowering it below the spend, or changing its delta or relation, is refused (409).")
def put_person_budget(name: PersonBudgetP, body: PersonBudgetIn, admin: AdminPrincipal,
                      session: WriteSessionDep) -> PersonBudgetOut:
    return svc.put_person_budget(session, name=name, body=body, actor=f"admin:{admin.subject}")


@router.get("/datasets/{dataset}/ledger", response_model=Page[LedgerEntryOut],
            summary="Ledger entries with event trees and parameters")
def get_ledger(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[LedgerEntryOut]:
    return svc.ledger_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.post("/datasets/{dataset}/trainings", response_model=TrainingAccepted, status_code=202,
             summary="Start a training run (budget reserved now; 409 when it would exceed the cap)",
             description="The run is recorded and its budget reserved in one transaction; it is then sent to the "
                         "workers. With the broker down the answer is still 202 naming the run, with "
                         "`enqueued: false`: the run waits in the outbox and is sent when a worker starts or "
                         "the beat runs. Never resubmit a 202: poll `status_url`.")
def post_training(dataset: DatasetP, body: TrainingIn, admin: AdminPrincipal, session: SessionDep,
                  settings: SettingsDep) -> TrainingAccepted:
    run_id = svc.start_training(session, dataset=dataset, body=body, actor=f"admin:{admin.subject}")
    commit(session)  # the unit of work, committed here: the answer says whether the enqueue after it worked
    sent = svc.enqueue(run_id, settings)
    return TrainingAccepted(run_id=run_id, status="queued", status_url=f"/v1/admin/trainings/{run_id}", enqueued=sent)


@router.get("/datasets/{dataset}/trainings", response_model=Page[TrainingRunOut], summary="Training runs")
def list_trainings(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[TrainingRunOut]:
    return svc.runs_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/trainings/{run_id}", response_model=TrainingRunOut, summary="Training run status and progress")
def get_training(run_id: IdP, _: AdminPrincipal, session: SessionDep) -> TrainingRunOut:
    return svc.run_view(session, run_id=run_id)


@router.get("/datasets/{dataset}/models", response_model=Page[ModelVersionOut], summary="Model versions")
def list_models(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[ModelVersionOut]:
    return svc.versions_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.post("/datasets/{dataset}/models/{version_id}/activate", response_model=ModelVersionOut,
             summary="Activate a model version (rollback)")
def activate_model(dataset: DatasetP, version_id: IdP, admin: AdminPrincipal, session: WriteSessionDep) -> ModelVersionOut:
    return svc.activate(session, dataset=dataset, version_id=version_id, actor=f"admin:{admin.subject}")
