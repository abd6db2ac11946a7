"""What the next training run would cost: "a run at ε = x composes to y" and "runs of ε = x
still affordable", by the ledger's own accountant (RDP at the account's δ; PLD beside it).

Composition is not additive, so ``cap - spent`` cannot answer either question: the run's event
is built exactly as a training request builds it (the active model's algorithm and public
hyper-parameters, calibrated to ε with the public catalogue size) and composed with every
charged event of the ledger. Nothing private is read: the history is the ledger's, the event
is data-independent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dp_accounting import dp_event
from sqlalchemy.orm import Session

from app import ledger
from app.core.algorithms import get_algorithm
from app.core.privacy.accounting import compose, epsilon_pld, epsilon_rdp
from app.errors import CalibrationFailed, InvalidEpsilon, UnknownAlgorithm
from app.services.budget import get_dataset
from app.services.training.requests import MIN_EPSILON, base_config, data_params, n_items_of, resolved_hyperparameters
from app.services.training.schedule import retrain_choice

__all__ = ["Projection", "MAX_AFFORDABLE", "project_run"]

MAX_AFFORDABLE = 10_000  # counts above this are reported as "at least MAX_AFFORDABLE"


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
    fits: bool
    affordable_runs: int | None  # None: the run costs nothing
    affordable_runs_capped: bool


def _choice(session: Session, ds: Any, algorithm: str | None) -> tuple[str, dict[str, Any], str | None]:
    """The active model's algorithm, public hyper-parameters and objective (what retraining
    would run), or ``algorithm`` with its defaults; DPALS on an empty data set."""
    active = retrain_choice(session, ds)  # the same choice as the scheduler
    if algorithm is None:
        return active or ("dpals", {}, None)
    if active is not None and active[0] == algorithm:
        return active
    return algorithm, {}, None


def _event(session: Session, ds: Any, acct: Any, algorithm: str, params: dict[str, Any],
           objective: str | None, epsilon: float) -> tuple[dp_event.DpEvent, dict[str, Any]]:
    """The run's event and hyper-parameters, built as
    :func:`app.services.training.requests.start_training` builds them (ε-aware defaults when none)."""
    try:
        algo = get_algorithm(algorithm)
    except ValueError as exc:
        raise UnknownAlgorithm(str(exc)) from exc
    n_items = n_items_of(session, ds)  # the public catalogue size
    params = resolved_hyperparameters(algo, ds, params, objective, float(epsilon), acct.delta, n_items)
    base = base_config(algo, ds, data_params(algo, ds, params))
    try:
        config = algo.calibrate(float(epsilon), acct.delta, base, n_items)
    except ValueError as exc:
        raise CalibrationFailed(f"cannot calibrate {algorithm} to epsilon {epsilon}: {exc}") from exc
    # as the reservation charges it: converted to the account's neighbouring relation
    charged = ledger.event_as_charged(acct, ds, algo.event(config, n_items), algo.event_parameters(config))
    return charged, params


def _total(history: list[dp_event.DpEvent], event: dp_event.DpEvent, k: int, delta: float) -> float:
    return epsilon_rdp(compose(history + [dp_event.SelfComposedDpEvent(event, k)]), delta)


def _affordable(history: list[dp_event.DpEvent], event: dp_event.DpEvent, cap: float,
                delta: float) -> tuple[int, bool]:
    """Largest k <= MAX_AFFORDABLE with composed(history + k runs) <= cap (monotone in k)."""
    if _total(history, event, 1, delta) > cap:
        return 0, False
    lo, hi = 1, 2
    while hi <= MAX_AFFORDABLE and _total(history, event, hi, delta) <= cap:
        lo, hi = hi, hi * 2
    if hi > MAX_AFFORDABLE:
        if _total(history, event, MAX_AFFORDABLE, delta) <= cap:
            return MAX_AFFORDABLE, True
        hi = MAX_AFFORDABLE
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _total(history, event, mid, delta) <= cap else (lo, mid)
    return lo, False


def project_run(session: Session, *, dataset: str, epsilon: float, algorithm: str | None = None) -> Projection:
    """Cost of one more run at ``epsilon`` and how many such runs the cap still allows."""
    if not (math.isfinite(epsilon) and epsilon >= MIN_EPSILON):
        raise InvalidEpsilon(f"epsilon must be a finite number >= {MIN_EPSILON}")
    ds = get_dataset(session, dataset)
    acct = ledger.account_for(session, ds.id)
    name, params, objective = _choice(session, ds, algorithm)
    event, params = _event(session, ds, acct, name, params, objective, epsilon)
    history = ledger.active_events(session, acct.id)
    alone = epsilon_rdp(event, acct.delta)
    total = compose(history + [event])
    composed = epsilon_rdp(total, acct.delta)
    if alone == 0.0:
        affordable, capped = None, False
    else:
        affordable, capped = _affordable(history, event, acct.epsilon_cap, acct.delta)
    spent = epsilon_rdp(compose(history), acct.delta) if history else 0.0
    return Projection(
        dataset=ds.name, algorithm=name, hyperparameters=params, epsilon=float(epsilon), delta=acct.delta,
        epsilon_cap=acct.epsilon_cap, spent_epsilon_rdp=ledger.round_up(spent),
        run_epsilon_rdp=ledger.round_up(alone), composed_epsilon_rdp=ledger.round_up(composed),
        composed_epsilon_pld=ledger.round_up(epsilon_pld(total, acct.delta)),
        fits=composed <= acct.epsilon_cap, affordable_runs=affordable, affordable_runs_capped=capped,
    )
