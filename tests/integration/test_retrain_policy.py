"""A data set's retrain policy and the block forecast, on SQLite and PostgreSQL: bounds, the
scheduler honouring the policy ('skipped:not_due', the policy's epsilon, the still-open block), the
forecast against a hand computation with dp_accounting, the warnings 14 intervals ahead (injected
clock), and the WARNING of every tick skipped for the budget."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from dp_accounting import rdp
from sqlalchemy import insert, select

from app import ledger
from app.core.privacy.accounting import RDP_ORDERS, compose, epsilon_rdp, event_from_json
from app.db.models import Item, LedgerEntry, Rating, TrainingRun, User
from app.db.session import session_scope
from app.db.stores import blocks as block_store
from app.errors import InvalidRetrainPolicy
from app.services import budget, policy
from app.services.training import forecast as ahead
from app.services.training import runner, schedule
from app.services.training.projection import run_event
from tests.integration.platform_helpers import create_dataset

DELTA = 1e-6
DAY0 = datetime(2031, 1, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
LOG = "app.services.training.schedule"


def _setup(url: str, period: str, name: str = "default", cap: float = 50.0) -> None:
    """A data set with a block calendar of ``period`` from DAY0, items and a few users of DAY0's cohort."""
    create_dataset(url, name, cap=cap, delta=DELTA)
    with session_scope(url) as s:
        block_store.ensure_calendar(s, period, DAY0)
        ds = budget.get_dataset(s, name)
        s.execute(insert(Item), [{"dataset_id": ds.id, "external_id": f"i{j}", "categories": [], "features": {}}
                                 for j in range(8)])
        s.execute(insert(User), [{"external_id": f"{name}-u{k}", "created_at": DAY0, "updated_at": DAY0}
                                 for k in range(4)])
        users = s.scalars(select(User.id).where(User.external_id.like(f"{name}-u%"))).all()
        items = s.scalars(select(Item.id).where(Item.dataset_id == ds.id)).all()
        s.execute(insert(Rating), [{"dataset_id": ds.id, "user_id": u, "item_id": i, "value": float(1 + (u + i) % 5),
                                    "created_at": DAY0, "updated_at": DAY0} for u in users for i in items])


def _set(url: str, settings, name: str = "default", **values) -> policy.RetrainPolicy:
    with session_scope(url) as s:
        return policy.set_policy(s, dataset=name, settings=settings, actor="t", **values)


def _tick(url: str, settings, now: datetime, name: str = "default") -> str:
    return schedule.scheduled_retrain(url=url, settings=settings, enqueue=False, now=now)[name]


def _run_id(outcome: str) -> int:
    assert outcome.startswith("started:"), outcome
    return int(outcome.split(":")[1])


def _event(url: str, eps: float, name: str = "default"):
    """The scheduler's run at ``eps`` (as the forecast builds it; DPALS on the ε-aware defaults)."""
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        return run_event(s, ds, DELTA, "dpals", {}, None, eps)


def _cap_for(event, k: int) -> float:
    """A cap that k runs of ``event`` fit and k + 1 do not (midway)."""
    return (epsilon_rdp(compose([event] * k), DELTA) + epsilon_rdp(compose([event] * (k + 1)), DELTA)) / 2


def _set_cap(url: str, cap: float, name: str = "default") -> None:
    with session_scope(url) as s:
        budget.change_cap(s, dataset=name, new_cap=cap, reason="test: blocks pay a known number of runs", actor="t")


def _burn(url: str, event, parameters, times: list[datetime], name: str = "default") -> None:
    """Scheduled runs' reservations at ``times`` (as the scheduler makes them; nothing trained)."""
    for at in times:
        with session_scope(url) as s:
            ds = budget.get_dataset(s, name)
            run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=0.5, delta=DELTA, status="failed",
                              trigger="schedule", created_at=at)
            s.add(run)
            s.flush()
            ledger.reserve(s, dataset=ds, event=event, parameters=parameters, actor="scheduler", run_id=run.id, now=at)


# ----------------------------------------------------------------------------- the policy
def test_policy_bounds_are_refused_and_unset_fields_take_the_deployment_setting(db_url, settings):
    create_dataset(db_url, cap=10.0, delta=DELTA)
    with session_scope(db_url) as s:
        p = policy.get_policy(s, dataset="default", settings=settings)
    assert (p.interval_s, p.epsilon, p.min_payable_blocks, p.read_current_block) == (
        settings.retrain_interval_s, settings.retrain_epsilon, settings.retrain_min_payable_blocks,
        settings.retrain_read_current_block)
    assert sorted(p.defaults) == ["epsilon", "interval_s", "min_payable_blocks", "read_current_block"]
    bad = [{"interval_s": 59}, {"interval_s": 366 * 86400 + 1}, {"interval_s": 3600.5}, {"interval_s": True},
           {"epsilon": 0.0}, {"epsilon": 0.0009}, {"epsilon": 1000.5}, {"epsilon": math.nan}, {"epsilon": math.inf},
           {"min_payable_blocks": 0}, {"min_payable_blocks": 10_001}, {"min_payable_blocks": 2.0}]
    for values in bad:
        with pytest.raises(InvalidRetrainPolicy):
            _set(db_url, settings, **values)
    p = _set(db_url, settings, interval_s=600, epsilon=0.25, min_payable_blocks=3, read_current_block=False)
    assert (p.interval_s, p.epsilon, p.min_payable_blocks, p.read_current_block, p.defaults) == (
        600, 0.25, 3, False, [])
    p = _set(db_url, settings, epsilon=0.5)  # every other field back to the deployment's
    assert (p.interval_s, p.epsilon, p.defaults) == (settings.retrain_interval_s, 0.5,
                                                     ["interval_s", "min_payable_blocks", "read_current_block"])


def test_the_scheduler_skips_a_data_set_whose_interval_has_not_elapsed(db_url, settings):
    """'skipped:not_due' from the policy and the latest scheduled run's time (public facts); each
    data set at its own interval and epsilon."""
    _setup(db_url, "month")
    _setup(db_url, "month", name="hourly")
    _set(db_url, settings, interval_s=86400, epsilon=0.5)
    _set(db_url, settings, "hourly", interval_s=3600, epsilon=0.25)
    first = schedule.scheduled_retrain(url=db_url, settings=settings, enqueue=False, now=DAY0)
    runs = {name: _run_id(out) for name, out in first.items()}
    with session_scope(db_url) as s:
        assert s.get(TrainingRun, runs["default"]).requested_epsilon == 0.5
        assert s.get(TrainingRun, runs["hourly"]).requested_epsilon == 0.25
    for run_id in runs.values():
        assert runner.run_training(run_id, url=db_url, settings=settings) == "succeeded"
    later = schedule.scheduled_retrain(url=db_url, settings=settings, enqueue=False, now=DAY0 + HOUR)
    assert later["default"] == "skipped:not_due"
    assert runner.run_training(_run_id(later["hourly"]), url=db_url, settings=settings) == "succeeded"
    assert _tick(db_url, settings, DAY0 + 23 * HOUR) == "skipped:not_due"
    assert _tick(db_url, settings, DAY0 + DAY - timedelta(seconds=30)).startswith("started:")  # a tick's drift


def test_runs_skip_the_still_open_block_when_the_policy_says_so(db_url, settings):
    _setup(db_url, "day")
    _set(db_url, settings, read_current_block=False, epsilon=0.5)
    run_id = _run_id(_tick(db_url, settings, DAY0 + DAY))
    with session_scope(db_url) as s:
        assert s.get(TrainingRun, run_id).cohorts == ["legacy", "2031-01-01"]  # not 2031-01-02, still open
    assert runner.run_training(run_id, url=db_url, settings=settings) == "succeeded"
    _set(db_url, settings, read_current_block=True, epsilon=0.5)
    run_id = _run_id(_tick(db_url, settings, DAY0 + 2 * DAY))
    with session_scope(db_url) as s:
        assert s.get(TrainingRun, run_id).cohorts == ["legacy", "2031-01-01", "2031-01-02", "2031-01-03"]


# ----------------------------------------------------------------------------- the forecast
def _hand_runs_left(event, n_before: int, cap: float) -> int:
    """dp_accounting's RDP accountant (the ledger's orders): the largest k with n_before + k runs of
    ``event`` composed within ``cap`` at DELTA."""
    k = 0
    while True:
        accountant = rdp.RdpAccountant(orders=list(RDP_ORDERS))
        accountant.compose(event, n_before + k + 1)
        if accountant.get_epsilon(DELTA) > cap:
            return k
        k += 1


def test_the_forecast_matches_a_hand_computation(db_url, settings):
    _setup(db_url, "day")
    _set(db_url, settings, interval_s=86400, epsilon=0.5, read_current_block=True)
    event, _, _ = _event(db_url, 0.5)
    _set_cap(db_url, _cap_for(event, 9))
    first = _run_id(_tick(db_url, settings, DAY0))  # charges legacy and 2031-01-01
    now = DAY0 + 6 * HOUR
    with session_scope(db_url) as s:
        entry = s.scalar(select(LedgerEntry).where(LedgerEntry.run_id == first, LedgerEntry.kind == "reservation"))
        charged = event_from_json(entry.event)
        cap = ledger.account_for(s, budget.get_dataset(s, "default").id).epsilon_cap
        f = ahead.forecast(s, dataset="default", settings=settings, now=now)
    assert f.next_run_at == DAY0 + DAY
    expected = _hand_runs_left(charged, 1, cap)
    assert expected == 8
    for label in ("legacy", "2031-01-01"):
        block = f.blocks[label]
        assert (block.runs_left, block.capped) == (expected, False)
        assert block.retires_at == DAY0 + DAY + expected * DAY  # the first scheduled run it cannot pay
    assert f.legacy_retires_at == DAY0 + 9 * DAY
    assert f.payable_blocks == 3  # legacy, 2031-01-01 and the day of the next run, 2031-01-02
    assert math.isclose(f.run_epsilon_rdp, ledger.round_up(epsilon_rdp(charged, DELTA)))
    with session_scope(db_url) as s:  # the blocks view carries the same numbers
        from app.services import admin

        page = admin.blocks_page(s, dataset="default", offset=0, limit=10, settings=settings)
    shown = {b.cohort: b for b in page.items}
    assert shown["legacy"].runs_left == expected and shown["legacy"].retires_at == DAY0 + 9 * DAY
    assert not shown["legacy"].retired


def test_a_shortfall_of_payable_blocks_is_warned_14_intervals_ahead(db_url, settings, caplog):
    """Monthly blocks, hourly runs, blocks paying 20 runs: the forecast puts the shortfall at run 20;
    the warning appears when it is 14 intervals away, not 15 (injected clock)."""
    _setup(db_url, "month")
    _set(db_url, settings, interval_s=3600, epsilon=0.5, min_payable_blocks=1)
    event, parameters, _ = _event(db_url, 0.5)
    _set_cap(db_url, _cap_for(event, 20))
    ticks = [DAY0 + j * HOUR for j in range(8)]
    _burn(db_url, event, parameters, ticks[:6])
    with session_scope(db_url) as s:
        early = ahead.forecast(s, dataset="default", settings=settings, now=ticks[5])
    assert early.shortfall_at == DAY0 + 20 * HOUR and early.reasons == []  # 15 intervals away
    caplog.clear()
    with caplog.at_level("WARNING", logger=LOG):
        run_id = _run_id(_tick(db_url, settings, ticks[6]))  # the 7th run
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "run short" in r.getMessage()]
    assert warned and "2031-01-02 08:00" in warned[0]  # DAY0 + 20 h, 14 intervals after the tick
    with session_scope(db_url) as s:
        late = ahead.forecast(s, dataset="default", settings=settings, now=ticks[6])
        assert s.get(TrainingRun, run_id).cohorts == ["legacy", "2031-01"]
    assert late.shortfall_at == ticks[6] + 14 * HOUR and "shortfall" in late.reasons


def test_legacy_retiring_is_warned_14_intervals_ahead(db_url, settings, caplog):
    _setup(db_url, "day")
    _set(db_url, settings, interval_s=86400, epsilon=0.5, min_payable_blocks=1)
    event, _, _ = _event(db_url, 0.5)
    _set_cap(db_url, _cap_for(event, 15))
    with caplog.at_level("WARNING", logger=LOG):
        first = _run_id(_tick(db_url, settings, DAY0))
    assert not [r for r in caplog.records if "legacy block" in r.getMessage()]
    with session_scope(db_url) as s:
        f = ahead.forecast(s, dataset="default", settings=settings, now=DAY0)
    assert f.legacy_retires_at == DAY0 + 15 * DAY and f.reasons == []  # 15 intervals away
    assert runner.run_training(first, url=db_url, settings=settings) == "succeeded"
    caplog.clear()
    with caplog.at_level("WARNING", logger=LOG):
        _run_id(_tick(db_url, settings, DAY0 + DAY))
    legacy = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "legacy block" in r.getMessage()]
    assert legacy and "2031-01-16 12:00" in legacy[0]  # DAY0 + 15 days: 14 intervals after this tick


def test_every_tick_skipped_for_the_budget_warns_with_the_day_the_next_block_opens(db_url, settings, caplog):
    _setup(db_url, "month")
    _set(db_url, settings, interval_s=3600, epsilon=0.5)
    event, _, _ = _event(db_url, 0.5)
    _set_cap(db_url, _cap_for(event, 1))
    assert runner.run_training(_run_id(_tick(db_url, settings, DAY0)), url=db_url, settings=settings) == "succeeded"
    for k in (1, 2, 3):
        caplog.clear()
        with caplog.at_level("WARNING", logger=LOG):
            assert _tick(db_url, settings, DAY0 + k * HOUR) == "skipped:budget"
        skipped = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "skipped" in r.getMessage()]
        assert len(skipped) == 1 and "the next block (2031-02) opens on 2031-02-01" in skipped[0]
    feb = _tick(db_url, settings, datetime(2031, 2, 1, 0, 30, tzinfo=UTC))
    with session_scope(db_url) as s:
        assert s.get(TrainingRun, _run_id(feb)).cohorts == ["2031-02"]


def test_the_forecast_reads_no_private_data(db_url, settings):
    """More users and ratings in a block change nothing the forecast says (ledger, calendar, policy)."""
    _setup(db_url, "day")
    _set(db_url, settings, interval_s=86400, epsilon=0.5)
    _run_id(_tick(db_url, settings, DAY0))
    with session_scope(db_url) as s:
        before = ahead.forecast(s, dataset="default", settings=settings, now=DAY0 + HOUR)
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        s.execute(insert(User), [{"external_id": f"late{k}", "created_at": DAY0, "updated_at": DAY0} for k in range(30)])
        late = s.scalars(select(User.id).where(User.external_id.like("late%"))).all()
        items = s.scalars(select(Item.id).where(Item.dataset_id == ds.id)).all()
        s.execute(insert(Rating), [{"dataset_id": ds.id, "user_id": u, "item_id": i, "value": 5.0, "created_at": DAY0,
                                    "updated_at": DAY0} for u in late for i in items])
    with session_scope(db_url) as s:
        assert ahead.forecast(s, dataset="default", settings=settings, now=DAY0 + HOUR) == before
    assert settings.retrain_tick == min(settings.retrain_tick_s, settings.retrain_interval_s)
