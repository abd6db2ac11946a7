"""User-level privacy blocks on SQLite and PostgreSQL: cohorts, block accounts opened by the
calendar, selection of the payable blocks before any private read, the loaders' cohort filter,
concurrent reservations over overlapping block sets, the migration of an existing ledger."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from alembic import command
from sqlalchemy import delete, insert, select

from app import ledger
from app.core.algorithms import get_algorithm
from app.core.privacy.accounting import compose, epsilon_rdp, gaussian
from app.core.privacy.composition import ComposedState
from app.db import loaders
from app.db.migrate import alembic_config, upgrade_head
from app.db.models import Item, PrivacyBlock, Rating, TrainingRun, User
from app.db.session import dispose_engines, session_scope
from app.db.stores import blocks as block_store
from app.db.stores import ratings_store
from app.errors import BudgetExceeded
from app.services import budget
from tests.integration.platform_helpers import create_dataset

DELTA = 1e-6
Z = 3.0
DAY0 = datetime(2031, 1, 1, 12, tzinfo=UTC)


def _day(k: int) -> datetime:
    return DAY0 + timedelta(days=k)


def _cap_fitting(k: int) -> float:
    fit = epsilon_rdp(compose([gaussian(Z)] * k), DELTA)
    return (fit + epsilon_rdp(compose([gaussian(Z)] * (k + 1)), DELTA)) / 2


def _daily(url: str, name: str = "default", cap: float = 10.0) -> None:
    create_dataset(url, name, cap=cap, delta=DELTA)
    with session_scope(url) as s:
        block_store.ensure_calendar(s, "day", DAY0)


def _reserve(url: str, now: datetime, name: str = "default", z: float = Z) -> list[str]:
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=1.0, delta=DELTA)
        s.add(run)
        s.flush()
        entry = ledger.reserve(s, dataset=ds, event=gaussian(z), parameters={}, actor="t", run_id=run.id, now=now)
        return list(entry.parameters["cohorts"])


def _add_users(url: str, name: str, prefix: str, n: int, created: datetime, n_items: int = 5) -> None:
    """``n`` users created at ``created``, each rating every one of ``n_items`` items."""
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        for j in range(n_items):
            if s.scalar(select(Item.id).where(Item.dataset_id == ds.id, Item.external_id == f"i{j}")) is None:
                s.execute(insert(Item), [{"dataset_id": ds.id, "external_id": f"i{j}", "categories": [], "features": {}}])
        s.execute(insert(User), [{"external_id": f"{prefix}{k}", "created_at": created, "updated_at": created}
                                 for k in range(n)])
        users = s.scalars(select(User.id).where(User.external_id.like(f"{prefix}%"))).all()
        items = s.scalars(select(Item.id).where(Item.dataset_id == ds.id)).all()
        s.execute(insert(Rating), [{"dataset_id": ds.id, "user_id": u, "item_id": i, "value": float(1 + (u + i) % 5),
                                    "created_at": created, "updated_at": created} for u in users for i in items])


def _loaded_users(url: str, cohorts: list[str], name: str = "default") -> set[str]:
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        ratings, _ = loaders.load_training_inputs(s, ds, get_algorithm("dpals"), cohorts=cohorts)
        ids = [int(u) for u in np.asarray(ratings.user_ids).tolist()]
        return set(s.scalars(select(User.external_id).where(User.id.in_(ids))).all()) if ids else set()


def test_empty_blocks_are_opened_selected_and_charged_by_the_calendar(db_url):
    _daily(db_url)
    assert _reserve(db_url, _day(2)) == ["legacy", "2031-01-01", "2031-01-02", "2031-01-03"]
    with session_scope(db_url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        blocks = block_store.blocks_of(s, f"account:{acct.id}")
        assert sorted(blocks) == ["2031-01-01", "2031-01-02", "2031-01-03", "legacy"]
        assert all(b.n_runs == 1 for b in blocks.values())
        alone = epsilon_rdp(gaussian(Z), DELTA)
        for b in blocks.values():
            assert ComposedState.from_json(b.composed_state).epsilon_rdp(DELTA) == pytest.approx(alone)


def test_block_selection_reads_no_private_data(db_url):
    """The same ledger and clock choose the same blocks with or without users and ratings."""
    cap = _cap_fitting(2)
    _daily(db_url, "a", cap=cap)
    _daily(db_url, "b", cap=cap)
    _add_users(db_url, "a", "ua", 4, _day(0))
    chosen = {name: [_reserve(db_url, _day(d), name) for d in (0, 0, 1, 2)] for name in "ab"}
    assert chosen["a"] == chosen["b"]
    assert chosen["a"][3] == ["2031-01-02", "2031-01-03"]  # legacy and day 0 are spent


def test_an_exhausted_block_is_never_loaded_and_its_users_do_not_matter(db_url):
    _daily(db_url, cap=_cap_fitting(1))
    _add_users(db_url, "default", "old", 3, _day(0))
    _reserve(db_url, _day(0))  # exhausts legacy and day 0
    _add_users(db_url, "default", "new", 3, _day(1))
    later = _reserve(db_url, _day(1))
    assert later == ["2031-01-02"]
    assert _loaded_users(db_url, later) == {"new0", "new1", "new2"}
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        before, _ = loaders.load_training_inputs(s, ds, get_algorithm("dpals"), cohorts=later)
    with session_scope(db_url) as s:
        ratings_store(s).delete_user("old1")
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        after, _ = loaders.load_training_inputs(s, ds, get_algorithm("dpals"), cohorts=later)
    assert np.array_equal(before.csr.toarray(), after.csr.toarray())
    algo = get_algorithm("dpals")
    config = algo.calibrate(1.0, DELTA, algo.config_from_params({"rank": 2, "seed": 7}, (1.0, 5.0)), before.n_items)
    one = algo.train(before, config, progress=None)
    two = algo.train(after, config, progress=None)
    assert np.array_equal(one.item_factors, two.item_factors)


def test_a_deleted_and_recreated_user_returns_to_her_cohort(db_url):
    _daily(db_url)
    _add_users(db_url, "default", "ann", 1, _day(0))
    assert _loaded_users(db_url, ["2031-01-01"]) == {"ann0"}
    with session_scope(db_url) as s:
        ratings_store(s).delete_user("ann0")
    _add_users(db_url, "default", "ann", 1, _day(5))
    assert _loaded_users(db_url, ["2031-01-06"]) == set()
    assert _loaded_users(db_url, ["2031-01-01"]) == {"ann0"}
    with session_scope(db_url) as s:
        assert block_store.cohort_of_user(s, "ann0") == "2031-01-01"


def test_a_local_guarantee_is_charged_to_a_block_opened_after_it(db_url):
    _daily(db_url)
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        ledger.record_local_guarantee(s, dataset=ds, event=gaussian(Z), parameters={}, actor="t", now=_day(0))
    _reserve(db_url, _day(3))
    with session_scope(db_url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        late = block_store.blocks_of(s, f"account:{acct.id}")["2031-01-04"]
        both = epsilon_rdp(compose([gaussian(Z)] * 2), DELTA)
        assert ComposedState.from_json(late.composed_state).epsilon_rdp(DELTA) == pytest.approx(both)
        assert all(check.ok for _, _, check in ledger.verify_blocks(s))


@pytest.mark.timeout(240)
def test_concurrent_reservations_over_overlapping_blocks_never_overspend(db_url):
    k = 2
    cap = _cap_fitting(k)
    _daily(db_url, "a", cap=cap)
    _daily(db_url, "b", cap=cap)
    with session_scope(db_url) as s:
        budget.put_person_budget(s, name="all", epsilon_cap=cap * 1.5, delta=None, relation=None, reason="t", actor="t")
    errors: list[BaseException] = []
    refused: list[BudgetExceeded] = []
    barrier = threading.Barrier(8)

    def attempt(name: str, day: int) -> None:
        barrier.wait()
        try:
            _reserve(db_url, _day(day), name)
        except BudgetExceeded as exc:
            refused.append(exc)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    # Each data set gets three requests at day 0 and one later (days 2 and 1): every request reaches
    # the legacy and day-0 blocks and takes both while they can pay, so those two stay in step and
    # hold k = 2 runs; the person budget (cap * 1.5 fits 5 events) never binds a cohort. So in
    # every interleaving at least one day-0 request of each data set finds nothing payable.
    days = (0, 0, 0, 0, 0, 0, 2, 1)
    threads = [threading.Thread(target=attempt, args=("ab"[i % 2], days[i])) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with session_scope(db_url) as s:
        for owner, cohort, check in ledger.verify_blocks(s):
            assert check.ok, (owner, cohort, check.reason)
        for block in s.scalars(select(PrivacyBlock).where(PrivacyBlock.account_id.is_not(None))):
            assert ComposedState.from_json(block.composed_state).n_events <= k
        assert len(refused) >= 2  # the blocks were contended: some requests found nothing payable


def test_ledger_verify_covers_block_entries(db_url):
    _daily(db_url)
    _reserve(db_url, _day(1))
    with session_scope(db_url) as s:
        assert all(check.ok for _, _, check in ledger.verify_blocks(s))
        block = s.scalars(select(PrivacyBlock).where(PrivacyBlock.cohort == "2031-01-02")).first()
        block.composed_state = ComposedState().to_json() | {"epsilon_pld": 0.0}
    with session_scope(db_url) as s:
        bad = [(owner, cohort) for owner, cohort, check in ledger.verify_blocks(s) if not check.ok]
        assert bad and all(cohort == "2031-01-02" for _, cohort in bad)


def test_migration_makes_existing_users_legacy_with_the_old_spend(db_url):
    create_dataset(db_url, "a", cap=60.0, delta=DELTA)
    _add_users(db_url, "a", "u", 2, _day(0))
    with session_scope(db_url) as s:
        s.execute(delete(PrivacyBlock))
    dispose_engines()
    command.downgrade(alembic_config(db_url), "0010")
    _old_reserve_on_0010(db_url)
    upgrade_head(db_url)
    with session_scope(db_url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "a").id)
        legacy = block_store.blocks_of(s, f"account:{acct.id}")["legacy"]
        assert legacy.composed_state == acct.composed_state
        assert legacy.n_runs == 2
        assert set(s.scalars(select(User.cohort))) == {"legacy"}
        assert all(check.ok for _, _, check in ledger.verify_blocks(s))
        everyone = ledger.person_budget_named(s, "all")  # its history list became its chain
        assert ledger.verify_person_chain(s, everyone).ok
        assert len(ledger.person_budget_entries(s, everyone.id)) >= 1
    assert _reserve(db_url, datetime.now(UTC), "a")[0] == "legacy"


def _old_reserve_on_0010(url: str) -> None:
    """Two reservations written as 0010 wrote them (no blocks): the state replayed by migration 0010."""
    from sqlalchemy import text

    from app.core.privacy.accounting import event_to_json

    with session_scope(url) as s:
        acct_id, old = s.execute(text("SELECT a.id, a.composed_state FROM budget_accounts a JOIN datasets d "
                                      "ON d.id = a.dataset_id WHERE d.name = 'a'")).one()
        assert old is not None
    dispose_engines()
    command.downgrade(alembic_config(url), "0009")
    with session_scope(url) as s:
        ds_id = s.execute(text("SELECT id FROM datasets WHERE name = 'a'")).scalar_one()
        prev = s.execute(text("SELECT hash FROM ledger_entries WHERE account_id = :a ORDER BY seq DESC LIMIT 1"),
                         {"a": acct_id}).scalar_one()
        for seq, run in ((2, 1001), (3, 1002)):
            s.execute(text("INSERT INTO training_runs (id, dataset_id, algorithm, config, requested_epsilon, delta, "
                           "status, progress, trigger, actor, ratings_version, attempts, private_data_read, refunded, "
                           "created_at) VALUES (:id, :ds, 'dpals', '{}', 1.0, :d, 'queued', 0, 'manual', 't', 0, 0, "
                           "false, false, :now)"), {"id": run, "ds": ds_id, "d": DELTA, "now": DAY0})
            import json
            s.execute(text("INSERT INTO ledger_entries (account_id, seq, kind, run_id, actor, event, parameters, "
                           "epsilon, spent_rdp, epsilon_cap, delta, created_at, prev_hash, hash) VALUES "
                           "(:a, :seq, 'reservation', :run, 't', :event, '{}', 1.0, 1.0, 60.0, :d, :at, :prev, :h)"),
                      {"a": acct_id, "seq": seq, "run": run, "event": json.dumps(event_to_json(gaussian(Z))),
                       "d": DELTA, "at": DAY0.isoformat(), "prev": prev, "h": f"{seq:064d}"})
            prev = f"{seq:064d}"
    command.upgrade(alembic_config(url), "0010")


def test_the_budget_view_lists_blocks_current_first_and_paged(db_url):
    _daily(db_url, cap=_cap_fitting(1))
    _reserve(db_url, _day(0))
    _reserve(db_url, _day(2))  # legacy and day 0 are spent: days 1 and 2 pay
    with session_scope(db_url) as s:
        rows, total = budget.list_blocks(s, dataset="default", offset=0, limit=2)
        assert total == 4 and [r.cohort for r in rows] == ["2031-01-03", "2031-01-02"]
        rest, _ = budget.list_blocks(s, dataset="default", offset=2, limit=2)
        assert [r.cohort for r in rest] == ["2031-01-01", "legacy"]
        assert [r.n_runs for r in rows + rest] == [1, 1, 1, 1]
        people, _ = budget.list_blocks(s, person_budget="all", offset=0, limit=10)
        assert [r.cohort for r in people][-1] == "legacy"
        view = budget.get_budget(s, dataset="default")
        assert view.n_blocks == 4
        assert all(r["ok"] for r in budget.verify_all(s))
        assert any("block" in r for r in budget.verify_all(s))


@pytest.mark.timeout(300)
def test_the_scheduler_goes_on_with_new_blocks_and_warns_when_they_run_out(db_url, settings, caplog):
    """A spent block stops nothing for ever: the next period's block pays; a skip and a shortage of
    payable blocks are WARNINGs."""
    from app.services.training import runner, schedule

    _daily(db_url, cap=settings.retrain_epsilon * 1.2)
    _add_users(db_url, "default", "u", 4, _day(0), n_items=8)
    sched = lambda day, hours=0: schedule.scheduled_retrain(  # noqa: E731
        url=db_url, settings=settings, enqueue=False, now=_day(day) + timedelta(hours=hours))["default"]
    first = sched(0)
    assert first.startswith("started:")
    assert runner.run_training(int(first.split(":")[1]), url=db_url, settings=settings) == "succeeded"
    caplog.clear()
    with caplog.at_level("WARNING", logger="app.services.training.schedule"):
        assert sched(0, hours=1) == "skipped:budget"  # due again an interval (1 h) later, the same day
    assert any(r.levelname == "WARNING" and "skipped" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="app.services.training.schedule"):
        later = sched(1)
    assert later.startswith("started:")
    assert any(r.levelname == "WARNING" and "running out" in r.getMessage() for r in caplog.records)
    with session_scope(db_url) as s:
        run = s.get(TrainingRun, int(later.split(":")[1]))
        assert run.cohorts == ["2031-01-02"]


def test_a_runs_user_bound_is_the_per_period_bound_times_the_blocks_it_may_read(db_url):
    from app.db.models import Dataset
    from app.services.training.requests import run_user_bound

    _daily(db_url, cap=_cap_fitting(1))
    _reserve(db_url, _day(0))
    with session_scope(db_url) as s:  # below the cap: every block may still pay some run
        ds = budget.get_dataset(s, "default")
        assert ledger.cohorts_with_room(s, ledger.account_for(s, ds.id), _day(2)) == [
            "legacy", "2031-01-01", "2031-01-02", "2031-01-03"]
    room = ["2031-01-02", "2031-01-03"]
    declared = Dataset(name="x", max_users=10_000, max_users_per_period=100)
    assert run_user_bound(declared, room) == 200
    assert run_user_bound(declared, ["legacy", *room]) == 10_000
    assert run_user_bound(Dataset(name="y", max_users=150, max_users_per_period=100), room) == 150
    assert run_user_bound(Dataset(name="z", max_users=None, max_users_per_period=100), ["legacy"]) is None
    assert run_user_bound(Dataset(name="w", max_users=70, max_users_per_period=None), room) == 70


def test_person_budget_cap_changes_are_hash_chained(db_url):
    from app.db.models import PersonBudgetEntry

    create_dataset(db_url, cap=5.0, delta=DELTA)
    with session_scope(db_url) as s:
        budget.put_person_budget(s, name="all", epsilon_cap=7.0, delta=None, relation=None, reason="more", actor="a")
        budget.put_person_budget(s, name="all", epsilon_cap=8.0, delta=None, relation=None, reason="again", actor="a")
    with session_scope(db_url) as s:
        view = budget.get_person_budget(s, name="all")
        assert [h["new_cap"] for h in view.history][-2:] == [7.0, 8.0]
        assert view.history[-1]["old_cap"] == 7.0 and view.history[-1]["reason"] == "again"
        assert ledger.verify_person_chain(s, ledger.person_budget_named(s, "all")).ok
        entry = s.scalars(select(PersonBudgetEntry).where(PersonBudgetEntry.reason == "more")).one()
        entry.reason = "less"
    with session_scope(db_url) as s:
        check = ledger.verify_person_chain(s, ledger.person_budget_named(s, "all"))
        assert not check.ok and "hash" in (check.reason or "")
        assert not all(r["ok"] for r in budget.verify_all(s))


@pytest.mark.timeout(120)
def test_block_selection_runs_with_the_private_tables_locked(pg_url):
    """PostgreSQL: with users, ratings and votes locked against any read, a reservation still chooses,
    charges and records its blocks (it reads none of them)."""
    from sqlalchemy import create_engine, text

    _daily(pg_url)
    _add_users(pg_url, "default", "u", 3, _day(0))
    engine = create_engine(pg_url)
    try:
        with engine.connect() as locker:
            locker.execute(text("LOCK TABLE users, ratings, votes IN ACCESS EXCLUSIVE MODE"))
            with session_scope(pg_url) as s:
                s.execute(text("SET LOCAL lock_timeout = '5s'"))
                ds = budget.get_dataset(s, "default")
                run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=1.0, delta=DELTA)
                s.add(run)
                s.flush()
                entry = ledger.reserve(s, dataset=ds, event=gaussian(Z), parameters={}, actor="t", run_id=run.id,
                                       now=_day(1))
                assert entry.parameters["cohorts"] == ["legacy", "2031-01-01", "2031-01-02"]
            locker.rollback()
    finally:
        engine.dispose()


def test_dpcmf_reads_public_users_whatever_their_block(db_url):
    """A public user of an unread block still feeds DP-CMF's public source (never the private ratings)."""
    from app.db.models import PublicRatingConsent

    _daily(db_url)
    _add_users(db_url, "default", "old", 2, _day(0))
    _add_users(db_url, "default", "new", 2, _day(1))
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        old0 = s.scalar(select(User.id).where(User.external_id == "old0"))
        s.add(PublicRatingConsent(dataset_id=ds.id, user_id=old0, public=True))
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        private, extra = loaders.load_training_inputs(s, ds, get_algorithm("dpcmf"), cohorts=["2031-01-02"])
        private_ids = {int(u) for u in np.asarray(private.user_ids).tolist()}
        names = set(s.scalars(select(User.external_id).where(User.id.in_(private_ids))).all())
        assert names == {"new0", "new1"}
        sources = {src.name: src for src in extra["public"].sources}
        assert sources["public_users"].matrix.nnz == 5  # old0's five ratings, read from an unread block
