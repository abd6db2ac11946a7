"""Event serialisation and accountant helpers."""

from __future__ import annotations

import json
import math

import pytest
from dp_accounting import dp_event

from app.core.mf.dpals import DPALSConfig, dpals_event
from app.core.privacy import accounting
from app.core.privacy.composition import ComposedState, affordable_runs, charge


def test_event_json_round_trip():
    event = dpals_event(DPALSConfig(reg_gravity=0.5, n_steps=4))
    text = json.dumps(accounting.event_to_json(event))
    back = accounting.event_from_json(json.loads(text))
    assert back == event
    assert accounting.epsilon_rdp(back, 1e-5) == accounting.epsilon_rdp(event, 1e-5)


@pytest.mark.parametrize(
    "payload",
    [
        {"module_name": "os", "class_name": "system", "command": "true"},
        {"module_name": "dp_accounting.dp_event", "class_name": "DpEvent"},
        {"module_name": "dp_accounting.dp_event", "class_name": "NoSuchEvent"},
        {"module_name": "dp_accounting.dp_event", "class_name": "GaussianDpEvent", "bogus": 1},
        {"module_name": "dp_accounting.dp_event", "class_name": "ComposedDpEvent",
         "events": [{"module_name": "builtins", "class_name": "eval"}]},
        ["not", "an", "object"],
    ],
)
def test_event_from_json_refuses_anything_but_dp_accounting_events(payload):
    with pytest.raises(ValueError):
        accounting.event_from_json(payload)


def test_count_gaussian_releases_expands_self_composition():
    event = accounting.compose([accounting.gaussian(1.0), dp_event.SelfComposedDpEvent(
        accounting.compose([accounting.gaussian(2.0), accounting.gaussian(3.0)]), 5)])
    assert accounting.count_gaussian_releases(event) == 11


def test_more_releases_cost_more():
    one = accounting.gaussian(3.0)
    two = accounting.compose([one, one])
    assert accounting.epsilon_rdp(two, 1e-5) > accounting.epsilon_rdp(one, 1e-5)
    assert accounting.epsilon_pld(two, 1e-5) > accounting.epsilon_pld(one, 1e-5)


def test_gaussian_rejects_non_positive_multipliers():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            accounting.gaussian(bad)


# ----------------------------------------------------------------------------- relations
from dp_accounting import NeighboringRelation  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402
from scipy import optimize, stats  # noqa: E402

from app.core.privacy.accounting import Relation, event_under, parse_relation, relation_implies  # noqa: E402

ADD, REPLACE, VALUES = Relation.ADD_OR_REMOVE_ONE_USER, Relation.REPLACE_ONE_USER, Relation.REPLACE_VOTE_VALUES


def test_one_vocabulary_reads_every_legacy_spelling():
    for text in ("add_or_remove_one_user", "add_remove_one_user", "add_or_remove_one"):
        assert parse_relation(text) is ADD
    assert parse_relation("replace_one_users_votes") is REPLACE
    assert parse_relation("replace_vote_values") is VALUES
    with pytest.raises(ValueError, match="unknown neighbouring relation"):
        parse_relation("add_or_remove_one_item")


def test_a_guarantee_implies_only_weaker_relations():
    order = [ADD, REPLACE, VALUES]
    for i, guarantee in enumerate(order):
        for j, account in enumerate(order):
            assert relation_implies(guarantee, account) is (i <= j)
    gauss = accounting.gaussian(3.0)
    assert event_under(gauss, ADD, ADD) is gauss and event_under(gauss, REPLACE, VALUES) is gauss
    for guarantee, account in [(VALUES, ADD), (VALUES, REPLACE), (REPLACE, ADD)]:
        with pytest.raises(ValueError, match="does not imply"):
            event_under(gauss, guarantee, account)


def _gdp_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ (Dong, Roth & Su 2019, Cor. 2.13): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    def gap(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta
    return optimize.brentq(gap, 0.0, 200.0, xtol=1e-12)


@pytest.mark.parametrize("z, count", [(1.0, 1), (3.0, 1), (11.9876, 1), (25.0, 40)])
def test_group_privacy_halves_the_gaussian_multiplier(z, count):
    """Replacing one user is two add/remove steps: an add/remove Gaussian of multiplier z is a
    z/2 Gaussian under replacement (μ-GDP -> 2μ-GDP). Checked against the closed form of 2μ√n-GDP
    and against dp_accounting's own RDP accountant on GaussianDpEvent(z/2)."""
    event = dp_event.SelfComposedDpEvent(accounting.gaussian(z), count) if count > 1 else accounting.gaussian(z)
    converted = event_under(event, ADD, REPLACE)
    delta = 1e-6
    mu = 2.0 * math.sqrt(count) / z
    assert accounting.epsilon_pld(converted, delta) == pytest.approx(_gdp_epsilon(mu, delta), rel=2e-3, abs=2e-3)
    library = rdp_privacy_accountant.RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    library.compose(dp_event.GaussianDpEvent(z / 2.0), count)
    assert accounting.epsilon_rdp(converted, delta) <= library.get_epsilon(delta) + 1e-9
    assert accounting.epsilon_rdp(converted, delta) > accounting.epsilon_rdp(event, delta)
    assert event_under(event, ADD, VALUES) == converted  # vote values changed are replace neighbours


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_group_privacy_doubles_a_pure_epsilon(eps):
    converted = event_under(accounting.pure_dp(eps), ADD, REPLACE)
    assert converted == accounting.pure_dp(2 * eps)
    assert accounting.epsilon_pld(converted, 1e-12) == pytest.approx(2 * eps, rel=1e-3)
    composed = event_under(accounting.compose([accounting.pure_dp(eps), accounting.gaussian(4.0)]), ADD, REPLACE)
    assert composed == accounting.compose([accounting.pure_dp(2 * eps), accounting.gaussian(2.0)])


def test_no_conversion_without_a_sound_rule():
    sampled = dp_event.PoissonSampledDpEvent(0.01, accounting.gaussian(1.0))  # amplification does not simply double
    with pytest.raises(ValueError, match="no sound group-privacy conversion"):
        event_under(sampled, ADD, REPLACE)
    assert event_under(dp_event.NoOpDpEvent(), ADD, REPLACE) == dp_event.NoOpDpEvent()


# ----------------------------------------------------------------------------- composed state
def _mixed_events() -> list[dp_event.DpEvent]:
    """DPALS runs, pure-DP pairs, randomised response and a free run, as a ledger may hold them."""
    return [dpals_event(DPALSConfig(reg_gravity=0.5, n_steps=4)), accounting.pure_dp(0.3),
            accounting.randomized_response(1.0), dp_event.NoOpDpEvent(),
            accounting.compose([accounting.gaussian(4.0), dp_event.SelfComposedDpEvent(accounting.pure_dp(0.1), 3)])]


def test_composed_state_is_the_accountants_composition_never_below_it():
    events = _mixed_events() * 7
    state = ComposedState.of((e, None) for e in events)
    exact_rdp = accounting.epsilon_rdp(accounting.compose(events), 1e-6)
    assert exact_rdp <= state.epsilon_rdp(1e-6) <= exact_rdp * (1 + 1e-12)
    library_curve = accounting.rdp_curve(accounting.compose(events))
    assert all(s >= x * (1 - 1e-15) for s, x in zip(state.rdp, library_curve, strict=True))
    assert state.epsilon_pld(1e-6) == pytest.approx(accounting.epsilon_pld(accounting.compose(events), 1e-6), rel=2e-3)
    assert state.epsilon_pld(1e-6) <= state.epsilon_rdp(1e-6)
    assert state.n_events == len(events)


def test_removing_an_event_gives_the_state_without_it():
    events = _mixed_events()
    full = ComposedState.of((e, "x") for e in events)
    without = ComposedState.of((e, "x") for k, e in enumerate(events) if k != 0)
    removed = full.remove(events[0], "x")
    assert removed.differences(without) == [] and removed.n_events == without.n_events
    assert removed.epsilon_rdp(1e-6) >= without.epsilon_rdp(1e-6) * (1 - 1e-12)


def test_composed_state_round_trips_and_refuses_another_grid():
    state = ComposedState.of((e, "add_or_remove_one_user") for e in _mixed_events())
    text = json.dumps(state.to_json(), allow_nan=False)
    assert ComposedState.from_json(json.loads(text)) == state
    assert ComposedState.from_json({**state.to_json(), "grid": "another"}) is None
    assert ComposedState.from_json(None) is None


def test_gaussian_exact_epsilon_matches_the_library_and_is_below_rdp():
    for z in (0.3, 1.0, 3.0, 30.0):
        exact = accounting.epsilon_gaussian_exact(z, 1e-6)
        assert exact == pytest.approx(accounting.epsilon_pld(accounting.gaussian(z), 1e-6), rel=2e-3)
        assert exact <= accounting.epsilon_rdp(accounting.gaussian(z), 1e-6)


def test_rdp_conversion_equals_the_librarys():
    from dp_accounting.rdp import rdp_privacy_accountant

    for event in _mixed_events():
        curve = accounting.rdp_curve(event)
        for delta in (1e-3, 1e-6, 1e-9):
            expected = rdp_privacy_accountant.compute_epsilon(accounting.RDP_ORDERS, curve, delta)[0]
            assert accounting.epsilon_of_rdp_curve(curve, delta) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_charge_converts_checks_the_cap_and_counts_affordable_runs():
    add_remove, replace = accounting.Relation.ADD_OR_REMOVE_ONE_USER, accounting.Relation.REPLACE_ONE_USER
    run = accounting.gaussian(3.0)
    state = ComposedState()
    cap = accounting.epsilon_rdp(accounting.compose([run] * 5), 1e-6) * 1.0001
    k, capped = affordable_runs(state, accounting.rdp_curve(run), delta=1e-6, cap=cap, limit=1000)
    assert (k, capped) == (5, False)
    accepted = 0
    while (result := charge(state, run, guarantee=add_remove, account=add_remove, delta=1e-6, cap=cap)).fits:
        state, accepted = result.state_after, accepted + 1
    assert accepted == k and result.epsilon_before == pytest.approx(state.epsilon_rdp(1e-6))
    converted = charge(ComposedState(), run, guarantee=add_remove, account=replace, delta=1e-6, cap=cap)
    assert converted.converted and converted.event == accounting.gaussian(1.5)
    with pytest.raises(ValueError):
        charge(ComposedState(), run, guarantee=replace, account=add_remove, delta=1e-6, cap=cap)
