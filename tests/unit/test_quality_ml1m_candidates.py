"""quality-ml1m's candidates keep their meaning under defaults rule 8 (the bound released from the
data): a candidate that doubles the contribution bound doubles the bound the run releases; and under
rule 14, a candidate that sets the user ridge runs with that ridge."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from benchmarks import quality_ml1m as q


def test_a_bound_change_scales_the_released_bound_where_the_default_releases_it() -> None:
    released = {"contribution_bound": 60, "bound_quantile": 0.5, "bound_scale": 1.5}
    assert q._bound_change(released, 120) == {"contribution_bound": 120, "bound_scale": 3.0}
    assert q._bound_change(released, 30) == {"contribution_bound": 30, "bound_scale": 0.75}
    assert q._bound_change(released, None) == {}
    fixed = {"contribution_bound": 60, "bound_quantile": None}
    assert q._bound_change(fixed, 120) == {"contribution_bound": 120}


@pytest.mark.parametrize("objective", ["rating", "ranking"])
def test_the_wider_and_changed_candidates_release_a_wider_bound(objective: str) -> None:
    base = q._RATING_BASE if objective == "rating" else q._RANKING_BASE
    changes = {10.0: [{"n_steps": 5, "contribution_bound": 480}]}
    task = cast(Any, SimpleNamespace(objective=objective, dpals_base=base, train=SimpleNamespace(n_items=3_000),
                                     default_changes=changes, dpals_candidates={10.0: []}))
    default, longer, wider, changed = q._candidates(task, 10.0, 1e-4)
    assert default["bound_quantile"] and longer["bound_scale"] == default["bound_scale"]
    assert wider["bound_scale"] == pytest.approx(2 * default["bound_scale"])
    assert wider["contribution_bound"] == 2 * default["contribution_bound"]
    ratio = 480 / default["contribution_bound"]
    assert changed["bound_scale"] == pytest.approx(ratio * default["bound_scale"], rel=1e-6)


def test_a_candidate_that_sets_the_user_ridge_runs_with_it() -> None:
    changes = {20.0: [{"reg_user": 0.25}, {"n_steps": 5}]}
    task = cast(Any, SimpleNamespace(objective="ranking", dpals_base=q._RANKING_BASE, train=SimpleNamespace(n_items=3_000),
                                     default_changes=changes, dpals_candidates={20.0: []}))
    default, longer, _, ridge, steps = q._candidates(task, 20.0, 1e-4)
    assert default["ridge_users_scale"] > 0 and longer["ridge_users_scale"] == default["ridge_users_scale"]  # rule 14
    assert (ridge["reg_user"], ridge["ridge_users_scale"]) == (0.25, 0.0)  # the ridge it names, not the law's
    assert steps["ridge_users_scale"] == default["ridge_users_scale"]
