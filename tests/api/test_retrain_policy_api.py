"""The retrain policy through the admin API and the CLI (bounds, 4xx), the block forecast in the
blocks view and its route, and its /metrics series."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app import cli
from app.config import reset_settings_cache
from app.db.session import dispose_engines
from tests.api.conftest import Env, seed_ratings, train_and_publish

POLICY = "/v1/admin/datasets/default/retrain-policy"
BAD_BODIES = [{"interval_s": 59}, {"interval_s": 366 * 86400 + 1}, {"interval_s": 3600.5}, {"interval_s": "daily"},
              {"epsilon": 0}, {"epsilon": 0.0009}, {"epsilon": 1000.5}, {"epsilon": "NaN"}, {"epsilon": -1},
              {"min_payable_blocks": 0}, {"min_payable_blocks": 10_001}, {"read_current_block": "perhaps"},
              {"interval_spelled_wrong": 60}]


def test_the_policy_is_set_within_bounds_and_refused_outside_them(env: Env) -> None:
    c, admin = env.client, env.admin
    default = c.get(POLICY, headers=admin).json()
    assert default == {"dataset": "default", "interval_s": env.settings.retrain_interval_s,
                       "epsilon": env.settings.retrain_epsilon,
                       "min_payable_blocks": env.settings.retrain_min_payable_blocks,
                       "read_current_block": env.settings.retrain_read_current_block,
                       "defaults": ["interval_s", "epsilon", "min_payable_blocks", "read_current_block"]}
    for body in BAD_BODIES:
        r = c.put(POLICY, headers=admin, json=body)
        assert r.status_code == 422, (body, r.text)
    assert c.get(POLICY, headers=admin).json() == default  # nothing changed
    assert c.put(POLICY, headers=env.auth("alice"), json={"epsilon": 0.5}).status_code == 403
    assert c.put("/v1/admin/datasets/nope/retrain-policy", headers=admin, json={}).status_code == 404
    r = c.put(POLICY, headers=admin, json={"interval_s": 600, "epsilon": 0.5, "min_payable_blocks": 3,
                                           "read_current_block": False})
    assert r.status_code == 200, r.text
    assert r.json() == {"dataset": "default", "interval_s": 600, "epsilon": 0.5, "min_payable_blocks": 3,
                        "read_current_block": False, "defaults": []}
    assert c.get(POLICY, headers=admin).json() == r.json()
    assert c.put(POLICY, headers=admin, json={}).json() == default  # back to the deployment's settings


def _metric(body: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", body, re.M)
    return None if found is None else float(found.group(1))


def test_the_forecast_shows_in_the_blocks_view_its_route_and_metrics(env: Env) -> None:
    c, admin = env.client, env.admin
    seed_ratings(env)
    train_and_publish(env, epsilon=1.0)  # opens the blocks it reads (legacy and this month's)
    calm = c.get("/v1/admin/datasets/default/budget/forecast", headers=admin)
    assert calm.status_code == 200, calm.text
    assert calm.json()["warnings"] == [] and calm.json()["shortfall_at"] is None
    body = c.get("/metrics", headers=admin).text
    assert _metric(body, "privrec_block_forecast_warning", dataset="default", reason="legacy") == 0.0
    assert _metric(body, "privrec_block_forecast_warning", dataset="default", reason="shortfall") == 0.0
    assert _metric(body, "privrec_block_shortfall_runs", dataset="default") is None

    # runs of epsilon 4 against caps of 10: the blocks retire within 14 intervals
    assert c.put(POLICY, headers=admin, json={"epsilon": 4}).status_code == 200
    asked_at = datetime.now(UTC)
    f = c.get("/v1/admin/datasets/default/budget/forecast", headers=admin).json()
    assert f["policy"]["epsilon"] == 4 and f["legacy_retires_at"] is not None and f["shortfall_at"] is not None
    assert any("legacy block" in w for w in f["warnings"]) and any("run short" in w for w in f["warnings"])
    blocks = c.get("/v1/admin/datasets/default/budget/blocks", headers=admin).json()["items"]
    legacy = next(b for b in blocks if b["cohort"] == "legacy")
    assert legacy["runs_left"] >= 1 and not legacy["retired"]
    # both views count from the clock of their own request: the same forecast, shifted by the time between them
    shift = (datetime.fromisoformat(legacy["retires_at"]) - datetime.fromisoformat(f["legacy_retires_at"]))
    assert timedelta(0) <= shift <= datetime.now(UTC) - asked_at + timedelta(seconds=1), shift
    body = c.get("/metrics", headers=admin).text
    assert _metric(body, "privrec_block_forecast_warning", dataset="default", reason="legacy") == 1.0
    assert _metric(body, "privrec_block_forecast_warning", dataset="default", reason="shortfall") == 1.0
    assert _metric(body, "privrec_block_shortfall_runs", dataset="default") == legacy["runs_left"]


def test_a_spent_block_shows_retired(env: Env) -> None:
    seed_ratings(env)
    train_and_publish(env, epsilon=9.5)
    assert env.client.put(POLICY, headers=env.admin, json={"epsilon": 4}).status_code == 200
    blocks = env.client.get("/v1/admin/datasets/default/budget/blocks", headers=env.admin).json()["items"]
    assert all(b["retired"] and b["runs_left"] == 0 and b["retires_at"] is None for b in blocks), blocks


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("SECRET_KEY", "cli-tests-secret-0123456789abcdef-xyz")
    monkeypatch.delenv("REDIS_URL", raising=False)
    reset_settings_cache()
    yield tmp_path
    dispose_engines()
    reset_settings_cache()


def test_the_cli_sets_one_field_keeps_the_others_and_refuses_bad_values(cli_env: Path, capsys) -> None:
    assert cli.main(["migrate"]) == 0
    capsys.readouterr()
    assert cli.main(["retrain-policy", "--epsilon", "0.5", "--interval-s", "7200"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == 0.5
    assert cli.main(["retrain-policy", "--no-read-current-block"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["epsilon"], out["interval_s"], out["read_current_block"]) == (0.5, 7200, False)
    assert out["defaults"] == ["min_payable_blocks"]
    with pytest.raises(SystemExit) as refused:
        cli.main(["retrain-policy", "--interval-s", "5"])
    assert "privrec retrain-policy: interval_s must be" in str(refused.value.code)  # one line, no traceback
    assert cli.main(["retrain-policy"]) == 0
    assert json.loads(capsys.readouterr().out)["interval_s"] == 7200  # unchanged by the refusal
    assert cli.main(["retrain-policy", "--reset"]) == 0
    assert json.loads(capsys.readouterr().out)["defaults"] == ["interval_s", "epsilon", "min_payable_blocks",
                                                               "read_current_block"]
    assert cli.main(["budget", "--forecast"]) == 0
    assert "next_run_at" in json.loads(capsys.readouterr().out)
