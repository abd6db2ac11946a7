"""Bodies of the admin routes (budget, ledger, trainings, model versions)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.privacy.accounting import Relation
from app.schemas.common import INT32_MAX, FiniteFloat, StrictModel, Text
from app.schemas.hyperparameters import MAX_HYPERPARAMETERS, bound_errors

MAX_EPSILON_CAP = 1_000.0
"""Largest epsilon cap (and run epsilon) accepted: far above any meaningful guarantee, and small
enough for the ledger's exact 6-decimal rounding."""
MAX_RATING_MAGNITUDE = 1e6
"""Rating bounds lie in [-10^6, 10^6]: every sensitivity scales with the range's width, and a
width near the float limit overflows (10^6 is far beyond any rating scale in use)."""

RETRAIN_INTERVAL_BOUNDS = (60, 366 * 24 * 3600)
"""A retrain policy's interval lies in [1 minute, 366 days] (seconds)."""
RETRAIN_EPSILON_BOUNDS = (1e-3, MAX_EPSILON_CAP)
"""A retrain policy's epsilon per run lies in [0.001, MAX_EPSILON_CAP] (as a training request's)."""
RETRAIN_MIN_BLOCKS_BOUNDS = (1, 10_000)
"""A retrain policy's minimum of payable blocks lies in [1, 10,000]."""

__all__ = [
    "MAX_EPSILON_CAP",
    "RETRAIN_INTERVAL_BOUNDS",
    "RETRAIN_EPSILON_BOUNDS",
    "RETRAIN_MIN_BLOCKS_BOUNDS",
    "RetrainPolicyIn",
    "RetrainPolicyOut",
    "ForecastOut",
    "MAX_RATING_MAGNITUDE",
    "BudgetOut",
    "BlockOut",
    "PersonBudgetIn",
    "PersonBudgetOut",
    "CapChangeIn",
    "DatasetIn",
    "DatasetOut",
    "DatasetPatchIn",
    "LedgerEntryOut",
    "TrainingIn",
    "TrainingAccepted",
    "TrainingRunOut",
    "ModelVersionOut",
    "ProjectionOut",
]


PERSON_BUDGET_NAME = r"^[A-Za-z0-9_\-]+$"

PrivacyUnit = Literal["user", "user_period"]
PRIVACY_UNIT_DOC = (
    "The privacy unit every epsilon of this budget is stated per, declared when it was created and "
    "never changed: `user` (a user with all of her data: her whole history is protected) or "
    "`user_period` (a user's ratings created in one calendar period of the block calendar: each "
    "period's data is protected, a user's whole history is not; blocks are keyed by the period of "
    "each rating's creation).")
UNIT_LABEL_DOC = "How to read every epsilon shown here: `per user` or `per user per period`."


class PersonBudgetOut(BaseModel):
    name: str
    epsilon_cap: float
    delta: float
    neighbouring_relation: Relation = Field(description=(
        "The relation every number of this per-person budget holds under; each member data set's "
        "relation implies it (add/remove events are converted by group privacy to a weaker one)."))
    spent_epsilon_rdp: float = Field(description=(
        "The charged events of all its data sets composed at its delta (RDP, rounded up): what one "
        "user id present in all of them can lose."))
    spent_epsilon_pld: float | None = Field(default=None, description="The same composition by the PLD accountant.")
    remaining_epsilon: float = Field(description="Cap minus spend (rounded down, >= 0).")
    datasets: list[str] = Field(default_factory=list, description="The data sets counting against it.")
    history: list[dict[str, Any]] = Field(default_factory=list, description="Audited creation and cap changes.")
    privacy_unit: PrivacyUnit = Field(default="user", description=PRIVACY_UNIT_DOC + " Its data sets declare the same.")
    privacy_unit_label: str = Field(default="per user", description=UNIT_LABEL_DOC)


class PersonBudgetIn(StrictModel):
    epsilon_cap: FiniteFloat = Field(gt=0, le=MAX_EPSILON_CAP, description=(
        "The per-person cap. Raising it needs a `reason`; lowering it below the spend is refused (409)."))
    delta: FiniteFloat | None = Field(default=None, gt=0, lt=1, description=(
        "The delta its composed spend is stated at (required on creation; fixed afterwards)."))
    neighbouring_relation: Relation | None = Field(default=None, description=(
        "Its relation (on creation; default `add_or_remove_one_user`; fixed afterwards). Data sets "
        "whose relation does not imply it cannot join it."))
    privacy_unit: PrivacyUnit | None = Field(default=None, description=(
        "Its privacy unit (on creation; default `user`; fixed afterwards: 409 `person_budget_fixed`). Only "
        "data sets of the same unit can join it (409 `privacy_unit_mismatch`)."))
    reason: Text | None = Field(default=None, max_length=1000, description="Stored in its history.")


class BudgetOut(BaseModel):
    dataset: str
    epsilon_cap: float
    delta: float
    accountant: str
    spent_epsilon_rdp: float = Field(description="Composed spend by the RDP accountant (rounded up).")
    spent_epsilon_pld: float | None = Field(description="Composed spend by the PLD accountant (rounded up).")
    remaining_epsilon: float = Field(description=(
        "Cap minus spend (rounded down, >= 0) for every cap that applies: the smaller of the data set's "
        "and its person budget's (`person_budget.remaining_epsilon`); `binding_cap` names the one. "
        "Composition is not additive: the projection says what a run actually costs."))
    dataset_remaining_epsilon: float | None = Field(default=None, description=(
        "The data set's own cap minus its own spend (rounded down, >= 0)."))
    binding_cap: Literal["dataset", "person_budget"] | None = Field(default=None, description=(
        "The cap with less room left: `dataset` (this data set's) or `person_budget` (the per-person "
        "budget it counts against)."))
    runs: dict[str, int] = Field(description="Training runs by status (private admin view: exact counts).")
    n_entries: int = 0
    n_charged_runs: int = 0
    n_local_guarantees: int = Field(default=0, description=(
        "Local guarantees in the ledger (votes randomised at ingestion), composed into the spend."))
    neighbouring_relation: Relation = Field(default=Relation.ADD_OR_REMOVE_ONE_USER, description=(
        "The account's neighbouring relation, declared when the data set was created: every epsilon "
        "shown here (cap, spent, remaining, each ledger entry's) holds under it. `add_or_remove_one_user` "
        "hides all of a user's data and membership; `replace_one_user` hides a user's data but not the "
        "number of users; `replace_vote_values` (randomised response) hides vote values, not which "
        "items a user voted on."))
    neighbouring_relations: list[str] = Field(default_factory=list, description=(
        "The relations under which the charged entries' guarantees were stated (each implies the "
        "account's; add/remove guarantees charged to a weaker account are converted by group privacy)."))
    person_budget: PersonBudgetOut | None = Field(default=None, description=(
        "The per-person bound this data set also counts against: every charge must fit both caps."))
    n_blocks: int = Field(default=0, description=(
        "Opened privacy blocks (one per cohort: the calendar period of a user's creation, and `legacy`). "
        "Each has the cap; spent and remaining above are the most spent block's."))
    current_block: str | None = Field(default=None, description="The cohort users joining now belong to.")
    privacy_unit: PrivacyUnit = Field(default="user", description=PRIVACY_UNIT_DOC)
    privacy_unit_label: str = Field(default="per user", description=UNIT_LABEL_DOC)


class BlockOut(BaseModel):
    cohort: str = Field(description="The block's cohort: a calendar period (UTC) of user creation, or `legacy`.")
    epsilon_cap: float
    delta: float
    spent_epsilon_rdp: float = Field(description="The block's composed spend by the RDP accountant (rounded up).")
    spent_epsilon_pld: float | None = Field(description="The same by the PLD accountant (rounded up).")
    remaining_epsilon: float = Field(description="Cap minus spend (rounded down, >= 0).")
    n_runs: int = Field(description="Runs charged to the block (local guarantees are charged to every block).")
    privacy_unit: PrivacyUnit = Field(default="user", description=PRIVACY_UNIT_DOC)
    privacy_unit_label: str = Field(default="per user", description=UNIT_LABEL_DOC)
    runs_left: int | None = Field(default=None, description=(
        "Forecast: scheduled runs at the retrain policy's epsilon the block can still pay (its data set's block "
        "and its person-budget block alike; 0: retired); null: such runs cost nothing, or no forecast (a "
        "person budget's blocks, charged by several data sets' policies)."))
    runs_left_capped: bool = Field(default=False, description="True when `runs_left` was cut at 10,000.")
    retires_at: datetime | None = Field(default=None, description=(
        "Forecast: the scheduled run (UTC) the block can no longer pay, at the policy's interval; null when "
        "retired, never, beyond the count's cut, or not forecast."))
    retired: bool = Field(default=False, description="The block cannot pay one more scheduled run.")


class RetrainPolicyIn(StrictModel):
    """A data set's retrain policy. A field left out or null takes the deployment's setting."""

    interval_s: int | None = Field(default=None, ge=RETRAIN_INTERVAL_BOUNDS[0], le=RETRAIN_INTERVAL_BOUNDS[1],
                                   description="Seconds between scheduled runs (RETRAIN_INTERVAL_S).")
    epsilon: FiniteFloat | None = Field(default=None, ge=RETRAIN_EPSILON_BOUNDS[0], le=RETRAIN_EPSILON_BOUNDS[1],
                                        description="Each scheduled run's epsilon (RETRAIN_EPSILON).")
    min_payable_blocks: int | None = Field(
        default=None, ge=RETRAIN_MIN_BLOCKS_BOUNDS[0], le=RETRAIN_MIN_BLOCKS_BOUNDS[1], description=(
            "Payable blocks worth training on: the scheduler warns when fewer could pay one more run, and 14 "
            "intervals before the forecast says so (RETRAIN_MIN_PAYABLE_BLOCKS)."))
    read_current_block: bool | None = Field(default=None, description=(
        "Whether scheduled runs read the still-open current block (RETRAIN_READ_CURRENT_BLOCK)."))


class RetrainPolicyOut(BaseModel):
    dataset: str
    interval_s: int
    epsilon: float
    min_payable_blocks: int
    read_current_block: bool
    defaults: list[str] = Field(description="The fields that take the deployment's setting.")


class ForecastOut(BaseModel):
    """When the data set's blocks retire at its retrain policy (ledger, calendar and policy only)."""

    dataset: str
    policy: RetrainPolicyOut
    next_run_at: datetime = Field(description="When the next scheduled run is due (UTC).")
    run_epsilon_rdp: float = Field(description="One scheduled run alone, as charged (RDP, rounded up).")
    payable_blocks: int = Field(description="Blocks that could pay the next scheduled run.")
    shortfall_at: datetime | None = Field(description=(
        "The first scheduled run at which fewer than `min_payable_blocks` blocks could pay (null: not within "
        "the forecast's horizon)."))
    legacy_retires_at: datetime | None = Field(description="The scheduled run `legacy` can no longer pay.")
    warnings: list[str] = Field(description=(
        "Shown at least 14 intervals ahead: fewer than the minimum of payable blocks, or `legacy` retiring."))


MAX_USERS_PER_PERIOD_DOC = (
    "Admin-declared public upper bound on the users who join this data set in one privacy-block period "
    "(null: not declared). A run's user bound (the ε-aware defaults, one-bit's `user_rows`) is it times "
    "the blocks the run may read, plus `max_users` for the `legacy` block, never above `max_users`.")

MAX_USERS_DOC = (
    "Admin-declared public upper bound on the number of users of this data set (null: not declared). "
    "Every rule that needs a user count reads it: delta above 1/(10 max_users) is warned about, and "
    "one-bit runs default `user_rows` to it (add/remove-one-user privacy; excess voters are dropped at random), "
    "and the ranking defaults take two steps instead of four (publishing the last step's item factors "
    "instead of the mean of the last two) where epsilon * max_users < 3000.")


class DatasetIn(StrictModel):
    """A new data set. ``rating_min`` must be below ``rating_max`` (422 otherwise)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: Text | None = Field(default=None, max_length=1000)
    rating_min: FiniteFloat = Field(ge=-MAX_RATING_MAGNITUDE, le=MAX_RATING_MAGNITUDE,
                                    description="Lowest rating accepted (public).")
    rating_max: FiniteFloat = Field(ge=-MAX_RATING_MAGNITUDE, le=MAX_RATING_MAGNITUDE,
                                    description="Highest rating accepted (public); must exceed `rating_min`.")
    epsilon_cap: FiniteFloat = Field(gt=0, le=MAX_EPSILON_CAP, description="Privacy budget cap for this data set.")
    delta: FiniteFloat = Field(gt=0, lt=1, description="The budget's delta.")
    kind: Literal["ratings", "votes"] = Field(default="ratings", description=(
        "What the data set collects (public, declared): scheduled retraining without an active model "
        "trains DPALS on `ratings` and one-bit completion on `votes`, never deciding from the data."))
    max_users: int | None = Field(default=None, ge=1, le=INT32_MAX, description=MAX_USERS_DOC)
    max_users_per_period: int | None = Field(default=None, ge=1, le=INT32_MAX, description=MAX_USERS_PER_PERIOD_DOC)
    neighbouring_relation: Relation = Field(default=Relation.ADD_OR_REMOVE_ONE_USER, description=(
        "The one relation the budget accounts under (fixed at creation). A run or local guarantee "
        "whose relation does not imply it is refused (409 `relation_not_implied`): e.g. votes "
        "randomised at ingestion need `replace_vote_values`, one-bit runs without `user_rows` need "
        "`replace_one_user`. Add/remove guarantees are converted (group privacy) to weaker accounts."))
    person_budget: str = Field(default="all", min_length=1, max_length=64, pattern=PERSON_BUDGET_NAME, description=(
        "The per-person budget (fixed at creation) composing this data set's events with those of "
        "every other data set that can hold the same person; `all` (every data set) by default. Its "
        "relation must be implied by `neighbouring_relation` (409 `relation_not_implied`)."))
    privacy_unit: PrivacyUnit = Field(default="user", description=(
        PRIVACY_UNIT_DOC + " Its person budget must be of the same unit (409 `privacy_unit_mismatch`); "
        "a `votes` data set is accounted per user (422 `privacy_unit_not_supported`)."))

    @model_validator(mode="after")
    def _range(self) -> DatasetIn:
        if not self.rating_min < self.rating_max:
            raise ValueError("rating_min must be below rating_max")
        return self


class DatasetOut(BaseModel):
    name: str
    description: str | None
    rating_min: float
    rating_max: float
    kind: str = Field(description="Declared kind: `ratings` or `votes` (public).")
    max_users: int | None = Field(description=MAX_USERS_DOC)
    max_users_per_period: int | None = Field(default=None, description=MAX_USERS_PER_PERIOD_DOC)
    privacy_unit: PrivacyUnit = Field(default="user", description=PRIVACY_UNIT_DOC)
    warnings: list[str] = Field(default_factory=list, description=(
        "Configuration warnings from public facts (e.g. delta above 1/(10 max_users))."))
    budget: BudgetOut


class DatasetPatchIn(StrictModel):
    kind: Literal["ratings", "votes"] | None = Field(default=None, description="New declared kind.")
    max_users: int | None = Field(default=None, ge=1, le=INT32_MAX, description=(
        "New declared bound on the number of users; an explicit null removes it. " + MAX_USERS_DOC))
    max_users_per_period: int | None = Field(default=None, ge=1, le=INT32_MAX, description=(
        "New declared bound on the users of one privacy block; an explicit null removes it. "
        + MAX_USERS_PER_PERIOD_DOC))
    privacy_unit: PrivacyUnit | None = Field(default=None, description=(
        "Fixed at creation: the current unit is accepted, another is refused (409 `privacy_unit_fixed`)."))


class CapChangeIn(StrictModel):
    """A new cap. Raising it needs a non-blank `reason` (422 otherwise); lowering it below what is
    already spent is refused (409)."""

    epsilon_cap: FiniteFloat = Field(gt=0, le=MAX_EPSILON_CAP, description="The new epsilon cap.")
    reason: Text | None = Field(default=None, max_length=1000,
                                description="Required when raising the cap; stored in the audited ledger entry.")


class LedgerEntryOut(BaseModel):
    seq: int
    kind: str
    run_id: int | None = None
    actor: str
    event: dict[str, Any] | None = Field(default=None, description="The dp_accounting event tree (JSON).")
    parameters: dict[str, Any] = Field(default_factory=dict, description="Parameters giving the event meaning.")
    epsilon: float | None = None
    spent_epsilon_rdp: float | None = Field(default=None, description="Composed spend after this entry (RDP, rounded up).")
    spent_epsilon_pld: float | None = None
    epsilon_cap: float | None = None
    delta: float | None = None
    reason: str | None = None
    created_at: datetime | None = None
    prev_hash: str | None = None
    hash: str | None = None


Objective = Literal["rating", "ranking"]
"""What a model optimises (the algorithms with ε-aware defaults per objective take one)."""


class TrainingIn(StrictModel):
    """A training request: at most one of `epsilon` and `epsilon_fraction` (both: 422)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"not": {"required": ["epsilon", "epsilon_fraction"]}})

    algorithm: str = Field(default="dpals", max_length=32, pattern=r"^[a-z0-9_\-]+$",
                           description='Training algorithm: "dpals" (default), "dpfw" (private Frank-Wolfe), '
                                       '"dpcmf" (DPALS with public item data) or "onebit" (thumbs up/down).')
    epsilon: FiniteFloat | None = Field(default=None, gt=0, le=MAX_EPSILON_CAP, description=(
        "Epsilon for this run. Give this or `epsilon_fraction`; omit both only for a run that costs "
        "nothing (onebit on votes randomised at ingestion: post-processing, charged 0)."))
    epsilon_fraction: FiniteFloat | None = Field(
        default=None, gt=0, le=1, description="Or: this fraction of the remaining budget.")
    objective: Objective | None = Field(default=None, description=(
        'What the model optimises (dpals, dpcmf): "rating" (explicit ratings, RMSE; the default) or '
        '"ranking" (top-N from positives: ratings at or above the public threshold, Recall@k).'))
    hyperparameters: dict[Annotated[str, Field(max_length=64)], Any] = Field(
        default_factory=dict, max_length=MAX_HYPERPARAMETERS, description=(
            "Algorithm configuration (e.g. rank, n_steps). Empty: DPALS and DP-CMF use the ε-aware "
            "defaults, a public rule of ε, δ, the objective, the rating range and the catalogue size "
            "(re-derived at each scheduled retrain's ε). Every knob is bounded above by what one worker "
            "and the exact noise sampler can do (e.g. rank <= 512, n_steps <= 1000, noise ratios in "
            "[1e-3, 1e3]); a knob past its bound is refused (422) before anything is reserved."))
    idempotency_key: Text | None = Field(default=None, min_length=1, max_length=128,
                                        description="Repeating a request with the same key returns the same run.")

    @model_validator(mode="after")
    def _one_budget(self) -> TrainingIn:
        # Neither is accepted here; the service then requires a run that costs nothing (onebit on
        # votes randomised at ingestion) and answers 422 otherwise.
        if self.epsilon is not None and self.epsilon_fraction is not None:
            raise ValueError("give exactly one of epsilon or epsilon_fraction")
        errors = bound_errors(self.hyperparameters)
        if errors:
            raise ValueError("hyper-parameters out of bounds: " + "; ".join(errors[:8]))
        return self


class TrainingAccepted(BaseModel):
    run_id: int
    status: str
    status_url: str
    enqueued: bool = Field(default=True, description=(
        "False when the broker was unreachable: the run is recorded, its budget reserved, and it waits "
        "in the outbox until a worker starts or the beat runs (it is then sent once). Do not resubmit: "
        "poll `status_url`."))


class TrainingRunOut(BaseModel):
    """A training run's status, progress and charge (its public config only: never the secret seed)."""

    id: int
    dataset: str | None = Field(default=None, description="The data set it trains on.")
    algorithm: str
    config: dict[str, Any] = Field(default_factory=dict, description="The calibrated public configuration.")
    requested_epsilon: float = Field(description="The run's target epsilon (0: a run that costs nothing).")
    epsilon_charged: float | None = Field(default=None, description="This run alone, as charged (RDP, rounded up).")
    delta: float
    status: Literal["queued", "running", "succeeded", "failed"]
    progress: float = Field(ge=0, le=1)
    stage: str | None = Field(default=None, description="The stage the worker reports (public).")
    error: str | None = Field(default=None, description=(
        "Why the run failed. Before the private read: the (public) reason. After it: a fixed category "
        "only, never a message derived from the data."))
    trigger: str = Field(description="What started it: `manual`, `schedule` or `demo`.")
    actor: str = Field(description="Who started it, e.g. `admin:root` or `scheduler`.")
    refunded: bool = Field(default=False, description=(
        "True when the reservation was refunded: only a run that failed before reading private data."))
    cancelled: bool = Field(default=False, description=(
        "True when an admin cancelled it (status `failed`, stage `cancelled`): charged when it had read "
        "private data, refunded otherwise."))
    private_data_read: bool = Field(default=False, description=(
        "True once the worker was about to read private data (or the worker vanished): the run is then "
        "charged whatever happens and never refunded."))
    enqueued: bool = Field(default=True, description=(
        "False while a queued run waits in the outbox (the broker was unreachable when it was created)."))
    attempts: int = Field(default=0, description="How many times a worker claimed it.")
    created_at: str | None = Field(default=None, description="ISO 8601 time.")
    started_at: str | None = Field(default=None, description="ISO 8601 time.")
    finished_at: str | None = Field(default=None, description="ISO 8601 time.")


class UtilityOut(BaseModel):
    """How much of a model stands clear of its noise (post-processing of its released counts)."""

    count_noise_std: float = Field(description="Std of the count release's noise (sensitivity x noise multiplier).")
    margin: float = Field(description="A count clears its noise when it exceeds margin x count_noise_std.")
    considered_items: int = Field(description="Items the model learnt factors for (its trained set).")
    clearing_items: int = Field(description="Considered items whose released count clears the margin.")
    clearing_share: float = Field(description="clearing_items / considered_items.")
    noise_dominated: bool = Field(description=(
        "Too few items clear their noise: the model ranks like DP popularity (predicts like the user mean)."))
    message: str | None = Field(default=None, description="What to do when noise-dominated.")


class ModelVersionOut(BaseModel):
    """A published model version: its release (epsilons rounded up), public metrics and metadata."""

    id: int = Field(description="Global id (used in paths): the same value as `model_version`.")
    model_version: int = Field(description=(
        "Global id, named as in every serving response (`model_version`) and in `GET /model`."))
    dataset_version: int = Field(description="Version number within the data set: 1, 2, ...")
    version: int = Field(deprecated=True, description=(
        "Deprecated: the same value as `dataset_version` (the name was ambiguous: serving responses call "
        "the global id `model_version`). Read `dataset_version`; this field goes in API v2."))
    run_id: int = Field(description="The training run that published it.")
    algorithm: str
    sha256: str = Field(description="SHA-256 of the sealed artifact.")
    epsilon: float = Field(description="Its own release (RDP, rounded up).")
    epsilon_pld: float | None = Field(default=None, description="The same by the PLD accountant (rounded up).")
    delta: float
    n_items: int
    rank: int
    metrics: dict[str, Any] = Field(default_factory=dict, description="Public (DP) metrics only.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Public model metadata.")
    utility: UtilityOut | None = Field(default=None, description=(
        "Utility indicator computed at publish time from the released counts and public constants only "
        "(post-processing); null for models that release no counts or were published before it existed."))
    active: bool
    pinned: bool = Field(default=False, description=(
        "True for the active version an admin activated (a rollback): it stays active until unpinned "
        "(`POST .../models/unpin`); versions published meanwhile wait, inactive."))
    created_at: str | None = Field(default=None, description="ISO 8601 time.")
    activated_at: str | None = Field(default=None, description="ISO 8601 time.")


class ProjectionOut(BaseModel):
    """What one more run at `epsilon` would cost, composed by the ledger's accountant."""

    dataset: str
    algorithm: str = Field(description="The active model's algorithm (or the one asked for; DPALS without a model).")
    hyperparameters: dict[str, Any] = Field(description="The public hyper-parameters the run would use.")
    epsilon: float = Field(description="The run's target epsilon.")
    delta: float
    epsilon_cap: float
    spent_epsilon_rdp: float = Field(description="Composed spend so far (RDP, rounded up).")
    run_epsilon_rdp: float = Field(description="The run alone (RDP, rounded up).")
    composed_epsilon_rdp: float = Field(description=(
        "A run at `epsilon` composes to this total (RDP, rounded up): not `spent + epsilon`."))
    composed_epsilon_pld: float = Field(description="The same total by the PLD accountant (reported beside).")
    fits: bool = Field(description="Whether the composed totals stay within every cap (data set and person budget).")
    affordable_runs: int | None = Field(description=(
        "How many runs at `epsilon` every cap that applies still allows: the least over the data set's "
        "cap and its person budget's (null: the run costs nothing)."))
    affordable_runs_capped: bool = Field(description="True when the count was cut at 10,000.")
    binding_cap: Literal["dataset", "person_budget"] | None = Field(default=None, description=(
        "The cap that limits `affordable_runs`: `dataset` (this data set's cap) or `person_budget` (the "
        "per-person budget it counts against); on a tie, the one with less room after one more run. "
        "Null when the run costs nothing."))
    person_budget: str | None = Field(default=None, description="The per-person budget the data set counts against.")
    person_epsilon_cap: float | None = Field(default=None, description="Its cap.")
    person_delta: float | None = Field(default=None, description="The delta its epsilons are stated at.")
    person_spent_epsilon_rdp: float | None = Field(default=None, description=(
        "Its composed spend over all its data sets so far (RDP, rounded up)."))
    person_composed_epsilon_rdp: float | None = Field(default=None, description=(
        "Its composed spend with one more run at `epsilon` (RDP, rounded up), under its relation."))
    privacy_unit: PrivacyUnit = Field(default="user", description=PRIVACY_UNIT_DOC)
    privacy_unit_label: str = Field(default="per user", description=UNIT_LABEL_DOC)


class LedgerCheckOut(BaseModel):
    """The hash chain's verification: every hash and every stored spend recomputed."""

    dataset: str
    ok: bool
    n_entries: int
    bad_seq: int | None
    reason: str | None


class ChartOut(BaseModel):
    """The dashboard's spend chart, rendered server-side over real time (UTC)."""

    points: int = Field(description="Charges drawn: one per run (at its last entry) and per local guarantee.")
    svg: str = Field(description="The SVG; empty when the ledger has no entry.")


class DashboardSummaryOut(BaseModel):
    """One data set on the dashboard: budget, chain check, projection at an ε and the spend chart."""

    budget: BudgetOut
    current_block: BlockOut | None = Field(default=None, description=(
        "The block users joining now belong to (None where the data set keeps no blocks)."))
    chain: LedgerCheckOut
    projection: ProjectionOut | None
    projection_error: str | None = Field(description="Why no projection could be made (e.g. no algorithm applies).")
    chart: ChartOut
    forecast: ForecastOut | None = Field(default=None, description="When the blocks retire at the retrain policy.")
    forecast_error: str | None = Field(default=None, description="Why no forecast could be made.")


class DashboardTrainingOut(BaseModel):
    """A training started from the dashboard (queued; the workers pick it up after the commit)."""

    run_id: int
    status: Literal["queued"]
