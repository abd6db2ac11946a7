"""The ``lifetime`` suite's tiny form, end to end on the service's own ledger (embedded SQLite,
injected clock): the CI check of the suite (its quick form is ``python -m benchmarks lifetime --quick``);
and the ``user-period`` policy's training rows against the service's own loader."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.core.privacy.blocks import LEGACY
from benchmarks import lifetime as L

POLICY_NAMES = ("single-cap", "cohort-blocks", "user-period")


@pytest.mark.timeout(300)
def test_lifetime_tiny_form_runs_on_the_services_ledger():
    life = L.generate_life("tiny", replace(L.STEADY, days=84, arrivals_per_year=4_000.0, initial_items=200,
                                           items_per_day=1.0))
    rows = L.life_rows(life, "rating", window=14, seeds=(0,))
    by = {(r["dataset"], r["algorithm"], r["metric"]): r["value"] for r in rows}
    ends = (14, 28, 42, 56, 70)
    for policy in POLICY_NAMES:
        assert by[("tiny-rating", policy, "ledger_verify_ok")] == 1.0
        assert all(by[(f"tiny-rating@day{t:03d}", policy, "max_block_epsilon")] <= L.CAP for t in ends)
    # before the first blocks retire both user-level policies read every user: the same runs, the same models
    for t in (14, 28):
        assert by[(f"tiny-rating@day{t:03d}", "single-cap", "rmse")] == by[(f"tiny-rating@day{t:03d}", "cohort-blocks",
                                                                             "rmse")]
    # after legacy is spent (about 63 daily runs at ε = 1 under cap 10) single-cap's model is frozen
    # on the blocks its last run read; cohort-blocks and user-period go on with the blocks that can still pay
    assert by[("tiny-rating@day070", "single-cap", "active_blocks")] >= 3
    assert by[("tiny-rating@day070", "cohort-blocks", "active_blocks")] <= 2
    assert by[("tiny-rating@day070", "user-period", "active_blocks")] <= 2
    # every policy is scored on the same users, each served from all of her ratings
    for t in ends:
        assert len({by[(f"tiny-rating@day{t:03d}", p, "eval_users")] for p in POLICY_NAMES}) == 1
        assert all((f"tiny-rating@day{t:03d}", p, "rmse") in by for p in POLICY_NAMES)
    for policy in ("cohort-blocks", "user-period"):
        assert {r["metric"] for r in rows if r["dataset"] == "tiny-rating" and r["algorithm"] == policy} >= {
            "target_quality_within_10pct", "target_quality_not_below_baseline", "target_count_level_trained",
            "target_blocks_within_cap"}
    for policy in L.POLICIES[1:]:
        ledger_life = L.replay_ledger(replace(life, days=70), policy, "rating", [])
        assert LEGACY in ledger_life.runs[0].cohorts and LEGACY not in ledger_life.runs[-1].cohorts
        assert all(run.config is not None for run in ledger_life.runs)  # a new block always pays: never skipped


def _rows(ratings) -> set[tuple[str, int, float]]:
    """(row label, item index, value) of every training rating."""
    out = set()
    for r, label in enumerate(ratings.user_ids.tolist()):
        cols, vals = ratings.user_row(r)
        out |= {(str(label), int(c), float(v)) for c, v in zip(cols.tolist(), vals.tolist(), strict=True)}
    return out


@pytest.mark.timeout(120)
def test_user_period_trains_on_the_rows_the_services_loader_makes():
    """The life's ratings written through the service at their days (a ``user_period`` data set made
    by the suite's setup), then loaded for a run's periods: the same (user, period) rows, ratings
    and values as the suite trains on, with the ledger's first run reading every block."""
    from app.core.algorithms import get_algorithm
    from app.db import loaders
    from app.db.models import User
    from app.db.session import session_scope
    from app.db.stores import ratings_store
    from app.services import budget

    life = L.generate_life("small", replace(L.STEADY, days=75, arrivals_per_year=400.0, initial_items=30,
                                            items_per_day=0.2))
    policy = L.POLICIES[2]
    blocks = L.Blocks(*policy.rating_blocks(life))
    assert len(blocks.names) == 3  # January, February, March 2030
    with L._database() as url:
        L._setup(url, life, policy)
        L._add_items(url, 0, life.n_items_at(life.days - 1))
        with session_scope(url) as s:
            for u, i, v, d in zip(life.users.tolist(), life.items.tolist(), life.values.tolist(), life.day.tolist(),
                                  strict=True):
                assert ratings_store(s).upsert_one("life", f"u{u}", f"i{i}", v, life.clock(d)) is not None
        with session_scope(url) as s:
            user_of = {db_id: int(ext[1:]) for db_id, ext in s.query(User.id, User.external_id)}
        n_items = life.n_items_at(life.days - 1)
        for cohorts in ([LEGACY, "2030-01", "2030-02", "2030-03"], ["2030-02"], [LEGACY, "2030-01", "2030-03"]):
            with session_scope(url) as s:
                ds = budget.get_dataset(s, "life")
                served, _ = loaders.load_training_inputs(s, ds, get_algorithm("dpals"), cohorts=cohorts)
            service = {(f"{user_of[int(label.split('@')[0])]}@{label.split('@')[1]}", int(served.item_ids[c][1:]), v)
                       for label, c, v in _rows(served)}
            suite = policy.training_data(life, blocks.reads(cohorts), n_items)
            assert service == _rows(suite) and served.n_users == suite.n_users
        first = L._scheduled_run(url, life, 0, "rating")
        assert first.cohorts == (LEGACY, "2030-01") and np.all(blocks.reads(first.cohorts) == (life.day < 31))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy_index", [1, 2])
def test_the_suites_count_release_is_the_trained_runs(policy_index: int):
    """The bound a run's histogram releases, as the suite draws it for its count level (the run's
    rows' counts and noise seed), is the bound the trained run published, and so are the steps and
    noise scale the laws in it set (ranking, rule 10)."""
    life = L.generate_life("tiny", replace(L.STEADY, days=45, arrivals_per_year=3_000.0, initial_items=150,
                                           items_per_day=1.0))
    policy = L.POLICIES[policy_index]
    blocks = L.Blocks(*policy.rating_blocks(life), policy.unit)
    run = L.replay_ledger(life, policy, "ranking", []).runs[40]
    read = (life.day < run.day) & (life.values >= L.POSITIVE)
    per_user_block = np.zeros((life.n_users, len(blocks.names)), dtype=np.int64)
    np.add.at(per_user_block, (life.users[read], blocks.codes[read]), 1)
    released = L.released_config(run.config, blocks.unit_counts(per_user_block, run.cohorts), L.run_seed(1, run.day))
    model = L.train_run(life, policy, blocks, run, 1)
    for name in ("contribution_bound", "n_steps", "later_noise_scale", "frequent_snr"):
        assert model.config[name] == getattr(released, name)
    assert released.contribution_bound < run.config["contribution_bound"]  # the declared largest B is not the run's
