"""The ``lifetime`` suite's tiny form, end to end on the service's own ledger (embedded SQLite,
injected clock): the CI check of the suite (its quick form is ``python -m benchmarks lifetime --quick``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.privacy.blocks import LEGACY
from benchmarks import lifetime as L


@pytest.mark.timeout(300)
def test_lifetime_tiny_form_runs_on_the_services_ledger():
    life = L.generate_life("tiny", replace(L.STEADY, days=84, arrivals_per_year=4_000.0, initial_items=200,
                                           items_per_day=1.0))
    rows = L.life_rows(life, "rating", window=14, seeds=(0,))
    by = {(r["dataset"], r["algorithm"], r["metric"]): r["value"] for r in rows}
    for policy in ("single-cap", "cohort-blocks"):
        assert by[("tiny-rating", policy, "ledger_verify_ok")] == 1.0
        assert all(by[(f"tiny-rating@day{t:03d}", policy, "max_block_epsilon")] <= L.CAP for t in (14, 28, 42, 56, 70))
    # before the first blocks retire both policies read every user: the same runs, the same models
    for t in (14, 28):
        assert by[(f"tiny-rating@day{t:03d}", "single-cap", "rmse")] == by[(f"tiny-rating@day{t:03d}", "cohort-blocks",
                                                                             "rmse")]
    # after legacy is spent (about 63 daily runs at ε = 1 under cap 10) single-cap's model is frozen
    # on the blocks its last run read; cohort-blocks goes on with the blocks that can still pay
    assert by[("tiny-rating@day070", "single-cap", "active_blocks")] >= 3
    assert by[("tiny-rating@day070", "cohort-blocks", "active_blocks")] <= 2
    assert {r["metric"] for r in rows if r["dataset"] == "tiny-rating" and r["algorithm"] == "cohort-blocks"} >= {
        "target_quality_within_10pct", "target_quality_not_below_baseline", "target_count_level_trained",
        "target_blocks_within_cap"}
    ledger_life = L.replay_ledger(replace(life, days=70), L.POLICIES[1], "rating", [])
    assert LEGACY in ledger_life.runs[0].cohorts and LEGACY not in ledger_life.runs[-1].cohorts
    assert all(run.config is not None for run in ledger_life.runs)  # a new block always pays: never skipped
