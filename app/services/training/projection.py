"""What the next training run would cost: "a run at ε = x composes to y" and "runs of ε = x
still affordable", by the ledger's own charge computation (RDP at each budget's δ; PLD beside it).

Composition is not additive, so ``cap - spent`` cannot answer either question: the run's event
is built exactly as a training request builds it (the active model's algorithm and public
hyper-parameters, calibrated to ε with the public catalogue size) and charged, as a reservation
charges it (:func:`app.ledger.preview_charge`), to every budget that applies: the data set's and
its person budget's, from their stored composed states. The affordable count is the smaller of
the two, and the projection names the cap that binds. Nothing private is read: the states are
the ledger's, the event is data-independent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dp_accounting import dp_event
from sqlalchemy.orm import Session

from app import ledger
from app.core.algorithms import get_algorithm
from app.core.privacy.blocks import UNIT_LABELS, USER
from app.core.privacy.composition import Charge, ComposedState, affordable_runs
from app.errors import CalibrationFailed, InvalidEpsilon, UnknownAlgorithm
from app.services.budget import get_dataset
from app.services.training.choice import retrain_choice
from app.services.training.requests import MIN_EPSILON, base_config, data_params, n_items_of, resolved_hyperparameters

__all__ = ["Projection", "MAX_AFFORDABLE", "project_run", "run_event", "DATASET_CAP", "PERSON_CAP"]

MAX_AFFORDABLE = 10_000  # counts above this are reported as "at least MAX_AFFORDABLE"
DATASET_CAP = "dataset"  # names of the caps a projection may report as binding
PERSON_CAP = "person_budget"


@dataclass(frozen=True)
class Projection:
    dataset: str
    algorithm: str
    hyperparameters: dict[str, Any]
    epsilon: float
    delta: float
    epsilon_cap: float
    spent_epsilon_rdp: float
    run_epsilon_rdp: float  # the run alone
    composed_epsilon_rdp: float  # history + this run (rounded up)
    composed_epsilon_pld: float
    fits: bool  # within every cap that applies
    affordable_runs: int | None  # None: the run costs nothing; else the least over every cap
    affordable_runs_capped: bool
    binding_cap: str | None  # DATASET_CAP or PERSON_CAP: the cap that limits; None for a free run
    person_budget: str
    person_epsilon_cap: float
    person_delta: float
    person_spent_epsilon_rdp: float
    person_composed_epsilon_rdp: float
    privacy_unit: str = USER  # every epsilon above is per this unit
    privacy_unit_label: str = UNIT_LABELS[USER]


def _choice(session: Session, ds: Any, algorithm: str | None) -> tuple[str, dict[str, Any], str | None]:
    """The active model's algorithm, public hyper-parameters and objective (what retraining
    would run), or ``algorithm`` with its defaults; DPALS on an empty data set."""
    active = retrain_choice(session, ds)  # the same choice as the scheduler
    if algorithm is None:
        return active or ("dpals", {}, None)
    if active is not None and active[0] == algorithm:
        return active
    return algorithm, {}, None


def run_event(session: Session, ds: Any, delta: float, algorithm: str, params: dict[str, Any],
           objective: str | None, epsilon: float) -> tuple[dp_event.DpEvent, dict[str, Any], dict[str, Any]]:
    """The run's released event, its guarantee's parameters and the hyper-parameters, built as
    :func:`app.services.training.requests.start_training` builds them (ε-aware defaults when none)."""
    try:
        algo = get_algorithm(algorithm)
    except ValueError as exc:
        raise UnknownAlgorithm(str(exc)) from exc
    n_items = n_items_of(session, ds)  # the public catalogue size
    params = resolved_hyperparameters(algo, ds, params, objective, float(epsilon), delta, n_items)
    base = base_config(algo, ds, data_params(algo, ds, params))
    try:
        config = algo.calibrate(float(epsilon), delta, base, n_items)
    except ValueError as exc:
        raise CalibrationFailed(f"cannot calibrate {algorithm} to epsilon {epsilon}: {exc}") from exc
    return algo.event(config, n_items), dict(algo.event_parameters(config)), params


def _affordable(state: ComposedState, run: Charge, delta: float) -> tuple[int, bool]:
    return affordable_runs(state, run.curve, delta=delta, cap=run.cap, limit=MAX_AFFORDABLE)


def _binding(own: tuple[int, bool], person: tuple[int, bool], own_run: Charge, person_run: Charge) -> str:
    """The cap allowing fewer runs; on a tie, the one with less room left after one more run."""
    if own[0] != person[0]:
        return DATASET_CAP if own[0] < person[0] else PERSON_CAP
    own_room = own_run.cap - own_run.epsilon_after
    return DATASET_CAP if own_room <= person_run.cap - person_run.epsilon_after else PERSON_CAP


def project_run(session: Session, *, dataset: str, epsilon: float, algorithm: str | None = None) -> Projection:
    """Cost of one more run at ``epsilon`` and how many such runs every cap still allows."""
    if not (math.isfinite(epsilon) and epsilon >= MIN_EPSILON):
        raise InvalidEpsilon(f"epsilon must be a finite number >= {MIN_EPSILON}")
    ds = get_dataset(session, dataset)
    acct = ledger.account_for(session, ds.id)
    name, params, objective = _choice(session, ds, algorithm)
    event, event_parameters, params = run_event(session, ds, acct.delta, name, params, objective, epsilon)
    preview = ledger.preview_charge(session, ds, event, event_parameters)
    own, person = preview.account, preview.person
    affordable: int | None = None
    capped, binding = False, None
    if own.epsilon_alone > 0.0 or person.epsilon_alone > 0.0:
        own_k = _affordable(preview.account_state, own, acct.delta)
        person_k = _affordable(preview.person_state, person, preview.person_budget.delta)
        binding = _binding(own_k, person_k, own, person)
        affordable, capped = own_k if binding == DATASET_CAP else person_k
    pb = preview.person_budget
    return Projection(
        dataset=ds.name, algorithm=name, hyperparameters=params, epsilon=float(epsilon), delta=acct.delta,
        epsilon_cap=acct.epsilon_cap, spent_epsilon_rdp=ledger.round_up(own.epsilon_before),
        run_epsilon_rdp=ledger.round_up(own.epsilon_alone), composed_epsilon_rdp=ledger.round_up(own.epsilon_after),
        composed_epsilon_pld=ledger.round_up(preview.account_state.epsilon_pld(acct.delta, extra=own.event)),
        fits=own.fits and person.fits, affordable_runs=affordable, affordable_runs_capped=capped,
        binding_cap=binding, person_budget=pb.name, person_epsilon_cap=pb.epsilon_cap, person_delta=pb.delta,
        person_spent_epsilon_rdp=ledger.round_up(person.epsilon_before),
        person_composed_epsilon_rdp=ledger.round_up(person.epsilon_after),
        privacy_unit=ds.privacy_unit, privacy_unit_label=UNIT_LABELS[ds.privacy_unit],
    )
