"""Event serialisation and accountant helpers."""

from __future__ import annotations

import json

import pytest
from dp_accounting import dp_event

from app.core import accounting
from app.core.dpals import DPALSConfig, dpals_event


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
