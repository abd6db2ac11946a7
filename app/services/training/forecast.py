"""When each privacy block retires, at the data set's retrain policy, and the warnings ahead of it.

From the ledger, the calendar and the policy only (public facts): the scheduler's next run is the
one :func:`app.services.training.choice.retrain_choice` picks, calibrated to the policy's epsilon
(:func:`app.services.training.projection.run_event`, as a training request builds it); every
scheduled run reads every block that can pay it (:func:`app.ledger.select_cohorts`), so block b,
readable from the i0-th scheduled run on (``legacy`` and past periods at once; a period from its
start, or, when the policy's runs do not read the still-open current block, from the next period's
start), pays runs i0 .. i0 + k - 1, where k is the number of runs of that event its data-set block
and its person-budget block can both still pay (:func:`app.ledger.block_room`). It retires at the
(i0 + k)-th run, ``next_run_at + (i0 + k) * interval``. The count of payable blocks at run i is the
number of blocks with i0 <= i < i0 + k (blocks that open later included, each starting with the
local guarantees already given). The forecast assumes no other data set charges the person budget's
blocks and the catalogue size stays as it is; it is redone on every call.

The warnings (:data:`WARN_INTERVALS` retrain intervals ahead): fewer than the policy's minimum of
payable blocks, or ``legacy`` retiring.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app import ledger
from app.config import Settings
from app.core.algorithms import get_algorithm
from app.core.privacy.blocks import LEGACY, cohorts_until, next_period_start, period_start
from app.db.models import Dataset, as_aware, utcnow
from app.db.stores import blocks as block_store
from app.db.stores.runs import runs_store
from app.services.budget import get_dataset
from app.services.policy import RetrainPolicy, policy_of
from app.services.training.choice import retrain_choice
from app.services.training.projection import MAX_AFFORDABLE, run_event
from app.services.training.requests import dataset_facts

__all__ = ["WARN_INTERVALS", "HORIZON_RUNS", "BlockForecast", "Forecast", "forecast", "next_run_at", "is_due",
           "next_block_opens"]

WARN_INTERVALS = 14  # warn this many retrain intervals ahead (at least)
HORIZON_RUNS = 4 * WARN_INTERVALS  # how many scheduled runs ahead a shortfall is looked for
MAX_FUTURE_BLOCKS = 5_000  # blocks opening within the horizon that are counted (a day period, a long interval)


@dataclass(frozen=True)
class BlockForecast:
    """One block's forecast: the scheduled runs it can still pay (None: they cost nothing), whether
    that count was cut at :data:`app.services.training.projection.MAX_AFFORDABLE`, the run it can no
    longer pay (None: retired, never, or beyond the cut)."""

    cohort: str
    runs_left: int | None
    capped: bool
    retires_at: datetime | None

    @property
    def retired(self) -> bool:
        return self.runs_left == 0


@dataclass(frozen=True)
class Forecast:
    """A data set's block forecast at its policy (see the module docstring)."""

    dataset: str
    policy: RetrainPolicy
    next_run_at: datetime
    run_epsilon_rdp: float
    payable_blocks: int
    shortfall_at: datetime | None
    legacy_retires_at: datetime | None
    warnings: list[str] = field(default_factory=list)
    blocks: dict[str, BlockForecast] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)  # of the warnings: "shortfall", "legacy"


def due_slack(interval_s: int) -> float:
    """A tick this early still counts as due (beat's ticks drift by milliseconds): 5 % of the
    interval, at most a minute."""
    return min(60.0, 0.05 * interval_s)


def next_run_at(session: Session, ds: Dataset, policy: RetrainPolicy, now: datetime) -> datetime:
    """When the data set's next scheduled run is due: ``now`` when it never ran on schedule or its
    interval has elapsed, else its latest scheduled run plus the interval."""
    last = runs_store(session).last_scheduled_at(ds.id)
    if last is None:
        return now
    return max(now, as_aware(last) + timedelta(seconds=policy.interval_s))


def is_due(session: Session, ds: Dataset, policy: RetrainPolicy, now: datetime) -> bool:
    """Whether the policy's interval has elapsed since the data set's latest scheduled run (public
    facts: the runs' creation times and the policy)."""
    last = runs_store(session).last_scheduled_at(ds.id)
    return last is None or (now - as_aware(last)).total_seconds() >= policy.interval_s - due_slack(policy.interval_s)


def next_block_opens(session: Session, now: datetime) -> tuple[str, datetime] | None:
    """(the next period's cohort, when its block opens), from the calendar; None without one."""
    cal = block_store.calendar(session)
    return None if cal is None else next_period_start(now, cal.period)


def _first_run(label: str, period: str, read_current: bool, start: datetime, interval: timedelta) -> int:
    """The index of the first scheduled run (at ``start + i * interval``) that may read ``label``."""
    if label == LEGACY:
        return 0
    readable = period_start(label, period) if read_current else next_period_start(period_start(label, period), period)[1]
    return max(0, math.ceil((readable - start) / interval))


def _future_labels(first_after: str, period: str, until: datetime) -> list[str]:
    """The periods after ``first_after`` that start by ``until`` (at most :data:`MAX_FUTURE_BLOCKS`)."""
    out: list[str] = []
    label, opens = next_period_start(period_start(first_after, period), period)
    while opens <= until and len(out) < MAX_FUTURE_BLOCKS:
        out.append(label)
        label, opens = next_period_start(opens, period)
    return out


def forecast(session: Session, *, dataset: str, settings: Settings, now: datetime | None = None) -> Forecast:
    """The data set's block forecast at ``now`` (the clock; injectable). Raises the training request's
    4xx error when its next scheduled run cannot be built (e.g. the active model's hyper-parameters
    no longer apply)."""
    now = now or utcnow().replace(microsecond=0)
    ds = get_dataset(session, dataset)
    policy = policy_of(ds, settings)
    start = next_run_at(session, ds, policy, now)
    interval = timedelta(seconds=policy.interval_s)
    cal = block_store.calendar(session)
    if cal is None:
        return Forecast(ds.name, policy, start, 0.0, 0, None, None)
    acct = ledger.account_for(session, ds.id)
    algorithm, params, objective = retrain_choice(session, ds)
    if get_algorithm(algorithm).costs_nothing(params, dataset_facts(ds, n_items=0)):
        labels = cohorts_until(cal.start, start, cal.period)
        free = {label: BlockForecast(label, None, False, None) for label in labels}
        return Forecast(ds.name, policy, start, 0.0, len(labels), None, None, blocks=free)
    event, parameters, _ = run_event(session, ds, acct.delta, algorithm, params, objective, policy.epsilon)
    now_labels = cohorts_until(cal.start, now, cal.period)
    horizon_end = start + HORIZON_RUNS * interval
    future = _future_labels(now_labels[-1], cal.period, horizon_end) if now_labels[-1] != LEGACY else []
    rooms, alone = ledger.block_room(session, ds, event, parameters, [*now_labels, *future[:1]],
                                     limit=MAX_AFFORDABLE)
    read_current = policy.read_current_block
    first_now = {label: _first_run(label, cal.period, read_current, start, interval) for label in now_labels}
    blocks = {}
    for label in now_labels:
        room = rooms[label]
        retires = None if room.runs == 0 or room.capped else start + (first_now[label] + room.runs) * interval
        blocks[label] = BlockForecast(label, room.runs, room.capped, retires)
    firsts = [_first_run(label, cal.period, read_current, start, interval) for label in future]
    fresh = rooms[future[0]].runs if future else 0  # every later block opens with the same state

    def payable(i: int) -> int:
        known = sum(1 for label in now_labels if first_now[label] <= i < first_now[label] + rooms[label].runs)
        return known + bisect.bisect_right(firsts, i) - bisect.bisect_right(firsts, i - fresh)

    counts = [payable(i) for i in range(HORIZON_RUNS + 1)]
    short = next((i for i, n in enumerate(counts) if n < policy.min_payable_blocks), None)
    shortfall_at = None if short is None else start + short * interval
    legacy_at = blocks[LEGACY].retires_at if LEGACY in blocks else None
    result = Forecast(ds.name, policy, start, ledger.round_up(alone), counts[0], shortfall_at, legacy_at,
                      blocks=blocks)
    return _with_warnings(result, now, interval)


def _with_warnings(f: Forecast, now: datetime, interval: timedelta) -> Forecast:
    """``f`` with its warnings: a shortfall or ``legacy``'s retirement within :data:`WARN_INTERVALS`
    intervals of ``now``."""
    horizon = now + WARN_INTERVALS * interval
    warnings, reasons = [], []
    if f.shortfall_at is not None and f.shortfall_at <= horizon:
        reasons.append("shortfall")
        warnings.append(
            f"privacy blocks of {f.dataset!r} run short: from the scheduled run of {f.shortfall_at:%Y-%m-%d %H:%M} UTC "
            f"fewer than {f.policy.min_payable_blocks} blocks can pay a run at epsilon {f.policy.epsilon:g} "
            "(the retrain policy's epsilon or interval decides how fast blocks are spent)")
    if f.legacy_retires_at is not None and f.legacy_retires_at <= horizon:
        reasons.append("legacy")
        warnings.append(
            f"the legacy block of {f.dataset!r} retires at the scheduled run of {f.legacy_retires_at:%Y-%m-%d %H:%M} "
            "UTC: users from before privacy blocks then shape no new model (their recommendations go on)")
    return Forecast(f.dataset, f.policy, f.next_run_at, f.run_epsilon_rdp, f.payable_blocks, f.shortfall_at,
                    f.legacy_retires_at, warnings, f.blocks, reasons)
