"""Privacy budgets (admin): a data set's budget and cap, what a run would cost, the ledger, per-person
budgets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import AdminPrincipal, PageQ, SessionDep, SettingsDep, WriteSessionDep
from app.api.params import DatasetP
from app.schemas.admin import (
    MAX_EPSILON_CAP,
    PERSON_BUDGET_NAME,
    BlockOut,
    BudgetOut,
    CapChangeIn,
    ForecastOut,
    LedgerEntryOut,
    PersonBudgetIn,
    PersonBudgetOut,
    ProjectionOut,
    RetrainPolicyIn,
    RetrainPolicyOut,
)
from app.schemas.common import Page
from app.services import admin as admin_svc

router = APIRouter()

PersonBudgetP = Annotated[str, Path(min_length=1, max_length=64, pattern=PERSON_BUDGET_NAME,
                                    description="Per-person budget name, e.g. `all`.")]


@router.get("/admin/datasets/{dataset}/budget", tags=["admin"], response_model=BudgetOut, summary="Privacy budget")
def get_budget(dataset: DatasetP, _: AdminPrincipal, session: SessionDep) -> BudgetOut:
    return admin_svc.budget_view(session, dataset=dataset)


@router.get("/admin/datasets/{dataset}/budget/blocks", tags=["admin"], response_model=Page[BlockOut],
            summary="The data set's privacy blocks, current period first",
            description=("One block per cohort (the UTC calendar period in which a user was created, and "
                         "`legacy`), each with the data set's cap; a run reads and is charged to the blocks "
                         "that can pay for it. Each block carries its retirement forecast at the data set's "
                         "retrain policy (`runs_left`, `retires_at`)."))
def get_blocks(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ,
               settings: SettingsDep) -> Page[BlockOut]:
    return admin_svc.blocks_page(session, dataset=dataset, offset=page.offset, limit=page.limit, settings=settings)


@router.get("/admin/datasets/{dataset}/budget/forecast", tags=["admin"], response_model=ForecastOut,
            summary="When the data set's privacy blocks retire at its retrain policy",
            description=("From the ledger, the calendar and the retrain policy only: the next scheduled run, "
                         "when fewer than the policy's minimum of blocks could pay one, when `legacy` retires, "
                         "and the warnings shown at least 14 retrain intervals ahead."))
def get_forecast(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, settings: SettingsDep) -> ForecastOut:
    return admin_svc.forecast_view(session, dataset=dataset, settings=settings)


@router.get("/admin/datasets/{dataset}/retrain-policy", tags=["admin"], response_model=RetrainPolicyOut,
            summary="The data set's retrain policy")
def get_retrain_policy(dataset: DatasetP, _: AdminPrincipal, session: SessionDep,
                       settings: SettingsDep) -> RetrainPolicyOut:
    return admin_svc.retrain_policy(session, dataset=dataset, settings=settings)


@router.put("/admin/datasets/{dataset}/retrain-policy", tags=["admin"], response_model=RetrainPolicyOut,
            summary="Set the data set's retrain policy",
            description=("Interval, epsilon per scheduled run, the minimum of payable blocks worth training on "
                         "and whether scheduled runs read the still-open current block; a field left out or "
                         "null takes the deployment's setting. Out-of-bounds values are refused (422)."))
def put_retrain_policy(dataset: DatasetP, body: RetrainPolicyIn, admin: AdminPrincipal, session: WriteSessionDep,
                       settings: SettingsDep) -> RetrainPolicyOut:
    return admin_svc.set_retrain_policy(session, dataset=dataset, body=body, settings=settings,
                                        actor=f"admin:{admin.subject}")


@router.get("/admin/person-budgets/{name}/blocks", tags=["admin"], response_model=Page[BlockOut],
            summary="A per-person budget's privacy blocks, current period first")
def get_person_blocks(name: PersonBudgetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[BlockOut]:
    return admin_svc.blocks_page(session, person_budget=name, offset=page.offset, limit=page.limit)


@router.get("/admin/datasets/{dataset}/budget/projection", tags=["admin"], response_model=ProjectionOut,
            summary="What a run at epsilon would compose to, and how many such runs are affordable",
            description=("Composes the ledger's charged events with the event of one more run at `epsilon` "
                         "(the active model's algorithm and public hyper-parameters unless `algorithm` is "
                         "given), by the RDP accountant at the budget's delta, PLD beside it. Composition is "
                         "not additive: `remaining_epsilon` does not answer this."))
def get_projection(dataset: DatasetP, _: AdminPrincipal, session: SessionDep,
                   epsilon: Annotated[float, Query(ge=1e-3, le=MAX_EPSILON_CAP, description="The run's epsilon.")],
                   algorithm: Annotated[str | None, Query(max_length=32, pattern=r"^[a-z0-9_\-]+$")] = None) -> ProjectionOut:
    return admin_svc.projection(session, dataset=dataset, epsilon=epsilon, algorithm=algorithm)


@router.patch("/admin/datasets/{dataset}/budget", tags=["admin"], response_model=BudgetOut,
              summary="Change the epsilon cap (audited)",
              description="Raising the cap needs a `reason`; lowering it below what is spent is refused (409).")
def patch_budget(dataset: DatasetP, body: CapChangeIn, admin: AdminPrincipal, session: WriteSessionDep) -> BudgetOut:
    return admin_svc.change_cap(session, dataset=dataset, epsilon_cap=body.epsilon_cap, reason=body.reason,
                         actor=f"admin:{admin.subject}")


@router.get("/admin/datasets/{dataset}/ledger", tags=["admin"], response_model=Page[LedgerEntryOut],
            summary="Ledger entries with event trees and parameters")
def get_ledger(dataset: DatasetP, _: AdminPrincipal, session: SessionDep, page: PageQ) -> Page[LedgerEntryOut]:
    return admin_svc.ledger_page(session, dataset=dataset, offset=page.offset, limit=page.limit)


@router.get("/admin/person-budgets/{name}", tags=["admin"], response_model=PersonBudgetOut, summary="Per-person budget")
def get_person_budget(name: PersonBudgetP, _: AdminPrincipal, session: SessionDep) -> PersonBudgetOut:
    return admin_svc.person_budget_view(session, name=name)


@router.put("/admin/person-budgets/{name}", tags=["admin"], response_model=PersonBudgetOut,
            summary="Create a per-person budget or change its cap (audited)",
            description="The events of every data set naming it are composed against its cap in the same "
                        "locked reservation as the data set's own cap. Raising the cap needs a `reason`; "
                        "lowering it below the spend, or changing its delta or relation, is refused (409).")
def put_person_budget(name: PersonBudgetP, body: PersonBudgetIn, admin: AdminPrincipal,
                      session: WriteSessionDep) -> PersonBudgetOut:
    return admin_svc.put_person_budget(session, name=name, body=body, actor=f"admin:{admin.subject}")
