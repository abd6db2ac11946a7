"""The opt-in ``user_period`` privacy unit on SQLite and PostgreSQL: declared at creation and fixed;
a rating's period is the period of its creation (updates keep it); each (user, period) is its own
training row; removing one unit of an exhausted block changes no later run; a person budget holds one
unit; the migration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from alembic import command
from sqlalchemy import inspect, select

from app import ledger
from app.core.algorithms import get_algorithm
from app.core.privacy.accounting import compose, epsilon_rdp, gaussian
from app.db import loaders
from app.db.migrate import alembic_config, upgrade_head
from app.db.models import Item, LedgerEntry, TrainingRun
from app.db.session import dispose_engines, session_scope
from app.db.stores import blocks as block_store
from app.db.stores import ratings_store
from app.errors import PrivacyUnitMismatch
from app.services import budget

DELTA = 1e-6
Z = 3.0
DAY0 = datetime(2031, 1, 1, 12, tzinfo=UTC)
UNITS = "per_period"  # the user_period person budget of these tests


def _day(k: int) -> datetime:
    return DAY0 + timedelta(days=k)


def _cap_fitting(k: int) -> float:
    fit = epsilon_rdp(compose([gaussian(Z)] * k), DELTA)
    return (fit + epsilon_rdp(compose([gaussian(Z)] * (k + 1)), DELTA)) / 2


def _periodic(url: str, name: str = "p", cap: float = 10.0, n_items: int = 4) -> None:
    """A ``user_period`` data set on a daily calendar from DAY0, in its own person budget, with items."""
    with session_scope(url) as s:
        block_store.ensure_calendar(s, "day", DAY0)
        if budget.budget_store.find_person_budget(s, UNITS) is None:
            budget.put_person_budget(s, name=UNITS, epsilon_cap=cap, delta=DELTA, relation=None, reason="t",
                                     actor="t", privacy_unit="user_period")
    with session_scope(url) as s:
        ds = budget.ensure_dataset(s, name, rating_min=1.0, rating_max=5.0, epsilon_cap=cap, delta=DELTA,
                                   person_budget=UNITS, privacy_unit="user_period")
        s.add_all([Item(dataset_id=ds.id, external_id=f"i{j}", categories=[], features={}) for j in range(n_items)])


def _rate(url: str, user: str, items: list[int], value: float, at: datetime, name: str = "p") -> None:
    """``user`` rates ``items`` at ``at`` through the store's single-rating write (each dialect's own)."""
    with session_scope(url) as s:
        for j in items:
            assert ratings_store(s).upsert_one(name, user, f"i{j}", value, at) is not None


def _reserve(url: str, now: datetime, name: str = "p") -> list[str]:
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=1.0, delta=DELTA)
        s.add(run)
        s.flush()
        entry = ledger.reserve(s, dataset=ds, event=gaussian(Z), parameters={}, actor="t", run_id=run.id, now=now)
        return list(entry.parameters["cohorts"])


def _load(url: str, cohorts: list[str], name: str = "p", algorithm: str = "dpals"):
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        ratings, _ = loaders.load_training_inputs(s, ds, get_algorithm(algorithm), cohorts=cohorts)
        return ratings


def _rows(ratings) -> dict[str, dict[int, float]]:
    """label -> {item index: value} of every training row."""
    out = {}
    for r, label in enumerate(ratings.user_ids.tolist()):
        cols, vals = ratings.user_row(r)
        out[str(label)] = dict(zip(cols.tolist(), vals.tolist(), strict=True))
    return out


def _uid(url: str, user: str) -> int:
    from app.db.models import User

    with session_scope(url) as s:
        return int(s.scalar(select(User.id).where(User.external_id == user)))


def test_a_data_set_declares_its_unit_at_creation(db_url):
    _periodic(db_url)
    with session_scope(db_url) as s:
        budget.ensure_dataset(s, "u", rating_min=1.0, rating_max=5.0, epsilon_cap=10.0, delta=DELTA)
    with session_scope(db_url) as s:
        for name, unit, label in (("p", "user_period", "per user per period"), ("u", "user", "per user")):
            view = budget.get_budget(s, dataset=name)
            assert (view.privacy_unit, view.privacy_unit_label) == (unit, label)
            acct = ledger.account_for(s, budget.get_dataset(s, name).id)
            opened = s.scalars(select(LedgerEntry).where(LedgerEntry.account_id == acct.id, LedgerEntry.seq == 1)).one()
            assert opened.parameters["privacy_unit"] == unit  # on the hash chain
            blocks, _ = budget.list_blocks(s, dataset=name)
            assert all(b.privacy_unit_label == label for b in blocks)
        assert budget.get_person_budget(s, name=UNITS).privacy_unit_label == "per user per period"
        assert budget.get_person_budget(s, name="all").privacy_unit == "user"


def test_a_person_budget_holds_one_unit(db_url):
    _periodic(db_url)
    with pytest.raises(PrivacyUnitMismatch) as refused, session_scope(db_url) as s:
        budget.ensure_dataset(s, "x", rating_min=1.0, rating_max=5.0, epsilon_cap=10.0, delta=DELTA,
                              person_budget="all", privacy_unit="user_period")
    assert refused.value.status_code == 409 and refused.value.code == "privacy_unit_mismatch"
    with pytest.raises(PrivacyUnitMismatch), session_scope(db_url) as s:
        budget.ensure_dataset(s, "y", rating_min=1.0, rating_max=5.0, epsilon_cap=10.0, delta=DELTA,
                              person_budget=UNITS)  # a user-level data set into the user_period budget
    with session_scope(db_url) as s:
        assert budget.budget_store.find_dataset(s, "x") is None and budget.budget_store.find_dataset(s, "y") is None
        assert budget.get_person_budget(s, name=UNITS).datasets == ["p"]


def test_a_ratings_period_is_fixed_at_its_creation(db_url):
    _periodic(db_url)
    _rate(db_url, "ann", [0, 1], 2.0, _day(0))
    _rate(db_url, "ann", [0], 5.0, _day(3))  # an update: it stays in day 0's block
    with session_scope(db_url) as s:  # the batch path keeps it too
        store = ratings_store(s)
        ref = store.start_rating_write("p")
        uid = store.user_ids(["ann"], _day(4), lambda: None)[0]
        items = store.item_ids(ref, ["i1", "i2"])
        store.write_ratings(ref, [uid, uid], items, np.array([4.0, 3.0]), _day(4))
    day0 = _rows(_load(db_url, ["2031-01-01"]))
    assert day0 == {f"{uid}@2031-01-01": {0: 5.0, 1: 4.0}}
    assert _rows(_load(db_url, ["2031-01-04"])) == {}
    assert _rows(_load(db_url, ["2031-01-05"])) == {f"{uid}@2031-01-05": {2: 3.0}}
    with session_scope(db_url) as s:  # a deletion acts on the rating's own period
        assert ratings_store(s).delete_rating(budget.get_dataset(s, "p").id, "ann", "i1") == 1
    assert _rows(_load(db_url, ["2031-01-01", "2031-01-05"])) == {f"{uid}@2031-01-01": {0: 5.0},
                                                                   f"{uid}@2031-01-05": {2: 3.0}}


def test_the_loader_gives_each_user_and_period_its_own_row(db_url):
    _periodic(db_url)
    _rate(db_url, "ann", [0, 1], 4.0, _day(0))
    _rate(db_url, "ann", [2, 3], 2.0, _day(1))
    _rate(db_url, "bob", [0], 3.0, _day(1))
    _rate(db_url, "cat", [1], 1.0, _day(2))  # a period the run does not read: never loaded
    ann, bob = _uid(db_url, "ann"), _uid(db_url, "bob")
    for algorithm in ("dpals", "dpcmf"):
        ratings = _load(db_url, ["legacy", "2031-01-01", "2031-01-02"], algorithm=algorithm)
        assert _rows(ratings) == {f"{ann}@2031-01-01": {0: 4.0, 1: 4.0}, f"{ann}@2031-01-02": {2: 2.0, 3: 2.0},
                                  f"{bob}@2031-01-02": {0: 3.0}}
        assert ratings.n_users == 3 and ratings.nnz == 5
    with session_scope(db_url) as s:  # the privileged fold-in still reads all of a user's own ratings
        items, _ = ratings_store(s).user_ratings(budget.get_dataset(s, "p").id, "ann")
        assert sorted(items) == ["i0", "i1", "i2", "i3"]


def test_removing_one_unit_of_an_exhausted_block_leaves_a_later_run_identical(db_url):
    _periodic(db_url, cap=_cap_fitting(1), n_items=6)
    _rate(db_url, "ann", [0, 1, 2], 5.0, _day(0))
    _rate(db_url, "bob", [1, 2], 2.0, _day(0))
    assert _reserve(db_url, _day(0)) == ["legacy", "2031-01-01"]  # exhausts both
    _rate(db_url, "ann", [3, 4], 1.0, _day(1))
    _rate(db_url, "bob", [0, 5], 4.0, _day(1))
    later = _reserve(db_url, _day(1))
    assert later == ["2031-01-02"]
    before = _load(db_url, later)
    with session_scope(db_url) as s:  # remove the unit (ann, day 0): her ratings of that period
        ds_id = budget.get_dataset(s, "p").id
        assert sum(ratings_store(s).delete_rating(ds_id, "ann", f"i{j}") for j in (0, 1, 2)) == 3
    after = _load(db_url, later)
    assert before.user_ids.tolist() == after.user_ids.tolist()
    assert np.array_equal(before.csr.toarray(), after.csr.toarray())
    assert {label.split("@")[1] for label in after.user_ids.tolist()} == {"2031-01-02"}
    algo = get_algorithm("dpals")
    config = algo.calibrate(1.0, DELTA, algo.config_from_params({"rank": 2, "seed": 7}, (1.0, 5.0)), before.n_items)
    assert np.array_equal(algo.train(before, config, progress=None).item_factors,
                          algo.train(after, config, progress=None).item_factors)


def test_a_user_period_data_set_trains_end_to_end(db_url, settings):
    from app.services.training import requests, runner

    _periodic(db_url, n_items=8)
    for k, user in enumerate(("ann", "bob", "cat")):
        _rate(db_url, user, [k, k + 1, k + 2], 4.0, _day(0))
        _rate(db_url, user, [k + 3, k + 4], 2.0, _day(1))
    with session_scope(db_url) as s:
        run = requests.start_training(s, dataset="p", epsilon=1.0, hyperparameters={"rank": 2}, actor="t",
                                      now=_day(1))
        run_id, cohorts = run.id, run.cohorts
    assert cohorts == ["legacy", "2031-01-01", "2031-01-02"]
    assert runner.run_training(run_id, url=db_url, settings=settings) == "succeeded"


def test_the_migration_declares_every_existing_budget_user_level(db_url):
    with session_scope(db_url) as s:
        budget.ensure_dataset(s, "old", rating_min=1.0, rating_max=5.0, epsilon_cap=10.0, delta=DELTA)
    dispose_engines()
    command.downgrade(alembic_config(db_url), "0013")
    with session_scope(db_url) as s:
        for table in ("datasets", "person_budgets"):
            assert "privacy_unit" not in {c["name"] for c in inspect(s.connection()).get_columns(table)}
    dispose_engines()
    upgrade_head(db_url)
    with session_scope(db_url) as s:
        assert budget.get_dataset(s, "old").privacy_unit == "user"
        assert ledger.person_budget_named(s, "all").privacy_unit == "user"
    _periodic(db_url)  # and the new unit can be declared after it
    with session_scope(db_url) as s:
        assert budget.get_dataset(s, "p").privacy_unit == "user_period"


def test_dpcmf_reads_public_users_whole_and_private_units_by_period(db_url):
    from app.db.models import PublicRatingConsent

    _periodic(db_url)
    _rate(db_url, "ann", [0], 4.0, _day(1))
    _rate(db_url, "pub", [1, 2], 3.0, _day(0))
    _rate(db_url, "pub", [3], 5.0, _day(2))  # a period the run does not read: public all the same
    ann, pub = _uid(db_url, "ann"), _uid(db_url, "pub")
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "p")
        s.add(PublicRatingConsent(dataset_id=ds.id, user_id=pub, public=True))
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "p")
        private, extra = loaders.load_training_inputs(s, ds, get_algorithm("dpcmf"), cohorts=["2031-01-01", "2031-01-02"])
    assert _rows(private) == {f"{ann}@2031-01-02": {0: 4.0}}
    public = {src.name: src for src in extra["public"].sources}["public_users"]
    assert public.row_labels == (str(pub),) and public.matrix.nnz == 3
