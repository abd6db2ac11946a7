"""A rollback sticks: an activated version stays active (pinned) while later runs, scheduled ones
included, publish inactive versions; unpinning activates the newest; both are idempotent."""

from __future__ import annotations

from app.services.training.runner import run_training
from app.services.training.schedule import scheduled_retrain
from tests.api.conftest import Env, seed_ratings, train_and_publish

MODELS = "/v1/admin/datasets/default/models"


def _versions(env: Env) -> dict[int, dict]:
    return {m["model_version"]: m for m in env.client.get(MODELS, headers=env.admin).json()["items"]}


def _served(env: Env) -> int:
    return int(env.client.get("/v1/datasets/default/model").json()["model_version"])


def test_an_activated_version_stays_served_until_unpinned(env: Env) -> None:
    seed_ratings(env)
    v1 = train_and_publish(env, epsilon=1.0)
    v2 = train_and_publish(env, epsilon=1.0)
    assert _served(env) == v2 and not _versions(env)[v2]["pinned"]
    r = env.client.post(f"{MODELS}/{v1}/activate", headers=env.admin)
    assert r.status_code == 200 and r.json()["pinned"] is True and r.json()["active"] is True

    # a manual run and a scheduled one publish, inactive: the rollback sticks
    train_and_publish(env, epsilon=1.0)
    outcome = scheduled_retrain(settings=env.settings, url=env.settings.database_url, enqueue=False)["default"]
    assert outcome.startswith("started:"), outcome
    assert run_training(int(outcome.split(":")[1]), url=env.settings.database_url, settings=env.settings) == "succeeded"
    versions = _versions(env)
    assert len(versions) == 4 and _served(env) == v1
    assert [v for v, m in versions.items() if m["active"]] == [v1] and versions[v1]["pinned"]
    assert not any(m["pinned"] for v, m in versions.items() if v != v1)

    newest = max(versions, key=lambda v: versions[v]["dataset_version"])
    for _ in range(2):  # idempotent
        r = env.client.post(f"{MODELS}/unpin", headers=env.admin)
        assert r.status_code == 200, r.text
        assert r.json()["model_version"] == newest and r.json()["active"] and not r.json()["pinned"]
    assert _served(env) == newest
    latest = train_and_publish(env, epsilon=1.0)  # publications activate again
    assert _served(env) == latest


def test_unpin_without_a_published_model_is_404(env: Env) -> None:
    r = env.client.post(f"{MODELS}/unpin", headers=env.admin)
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_active_model"
    r = env.client.post("/v1/admin/datasets/nope/models/unpin", headers=env.admin)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_dataset"
