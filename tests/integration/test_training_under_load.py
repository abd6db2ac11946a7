"""Training requests under load and on retry, on SQLite and PostgreSQL: no 5xx after a charge,
no second charge for a blind retry, a replayed key with another body is 409, and the sampler's
range is checked before the reservation on every start path (not only the API's)."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.auth import issue_token
from app.db.models import LedgerEntry, TrainingRun
from app.db.session import dispose_engines, session_scope
from app.errors import InvalidHyperparameters
from app.main import create_app
from app.services.training import dispatch, requests, runner
from tests.integration.platform_helpers import create_dataset, make_settings, seed_ratings, synthetic_ratings

HYPER = {"rank": 4, "n_steps": 2, "contribution_bound": 20}
TRAININGS = "/v1/admin/datasets/default/trainings"
N_REQUESTS = 200


def _client(tmp_path, db_url, redis_url, **overrides):
    secret = secrets.token_hex(24)
    settings = make_settings(tmp_path, db_url, redis_url=redis_url, secret_key=secret, **overrides)
    admin = {"Authorization": f"Bearer {issue_token('root', secret=secret, kind='admin', ttl_seconds=600)}"}
    return TestClient(create_app(settings)), admin, settings


def _reservations(db_url: str, run_id: int | None = None) -> int:
    with session_scope(db_url) as s:
        where = [LedgerEntry.kind == "reservation"]
        if run_id is not None:
            where.append(LedgerEntry.run_id == run_id)
        return int(s.scalar(select(func.count()).select_from(LedgerEntry).where(*where)) or 0)


def _runs_by_key(db_url: str) -> dict[str | None, int]:
    with session_scope(db_url) as s:
        return dict(s.execute(select(TrainingRun.idempotency_key, TrainingRun.id)).all())


Answer = tuple[int, dict, str | None]  # status, body, Retry-After


def _answer(r) -> Answer:
    return r.status_code, r.json(), r.headers.get("retry-after")


def _refused_before_the_charge(answer: Answer) -> bool:
    """A refusal the load may cause, all of them before anything is reserved: no transaction
    slot or connection in time (503 with ``Retry-After``), or the budget (409)."""
    status, body, retry_after = answer
    code = body.get("error", {}).get("code")
    return ((status == 503 and code == "database_unavailable" and retry_after is not None)
            or (status == 409 and code == "budget_exceeded"))


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_200_concurrent_trainings_on_a_small_pool_never_answer_5xx_after_a_charge(db_url, redis_url, tmp_path):
    """200 requests (keyed, so each answer maps to its run) from 40 threads against a pool of
    one connection (plus one overflow; SQLite: a 1 s busy timeout, so that marking a charged run
    enqueued meets a locked database too): every request either got 202 for its run, charged
    once, or was refused before anything was reserved (503 with ``Retry-After``, or 409) and has
    no run; no other answer. Every 25th request is sent twice without a key: the retry gets the
    same run, charged once. The ledger charges exactly the runs answered 202, and replaying every
    keyed request afterwards (a blind retry) charges nothing more."""
    create_dataset(db_url, cap=1e6)
    seed_ratings(db_url, "default", synthetic_ratings(n_users=50, n_items=20, n_ratings=300))
    dispose_engines()  # the app builds its engine from the small-pool settings below
    client, admin, _ = _client(tmp_path, db_url, redis_url, db_pool_size=1, sqlite_busy_timeout_ms=1000)

    def keyed_body(i: int) -> dict:
        return {"epsilon": 1.0 + i / 1000, "hyperparameters": HYPER, "idempotency_key": f"load-{i}"}

    def keyed(i: int) -> tuple[str, Answer]:
        return f"load-{i}", _answer(client.post(TRAININGS, headers=admin, json=keyed_body(i)))

    def keyless(i: int) -> list[Answer]:
        body = {"epsilon": 2.0 + i / 1000, "hyperparameters": HYPER}
        return [_answer(client.post(TRAININGS, headers=admin, json=body)) for _ in range(2)]

    with client, ThreadPoolExecutor(40) as pool:
        keyed_answers = list(pool.map(keyed, range(N_REQUESTS)))
        retried = list(pool.map(keyless, range(0, N_REQUESTS, 25)))
        runs, charged_before_replay = _runs_by_key(db_url), _reservations(db_url)
        replays = list(pool.map(keyed, range(N_REQUESTS)))
    try:
        accepted = set()
        for key, answer in keyed_answers:
            status, body, _ = answer
            if key in runs:  # charged: the request that created it was answered for it
                assert status == 202 and body["run_id"] == runs[key], answer
                assert _reservations(db_url, runs[key]) == 1
                accepted.add(body["run_id"])
            else:  # refused before anything was reserved
                assert _refused_before_the_charge(answer), answer
        for pair in retried:
            ids = {body["run_id"] for status, body, _ in pair if status == 202}
            assert len(ids) <= 1, pair  # a blind retry never buys a second run
            for answer in pair:
                assert answer[0] == 202 or _refused_before_the_charge(answer), answer
            accepted |= ids
        assert charged_before_replay == len(runs) == len(accepted)  # one reservation per run answered 202
        for key, answer in replays:  # a charged run's replay names it; any other is answered as a first request
            status, body, _ = answer
            assert status == 202 or _refused_before_the_charge(answer), answer
            if key in runs and status == 202:
                assert body["run_id"] == runs[key], answer
        after_replay = _runs_by_key(db_url)
        assert {k: v for k, v in after_replay.items() if k in runs} == runs
        assert _reservations(db_url) == len(after_replay)  # a replay charges only a run it newly created
    finally:
        broker = redis.Redis.from_url(redis_url)
        broker.delete(dispatch.QUEUE)
        broker.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_replay_reports_the_true_status_and_another_body_is_409(db_url, tmp_path):
    create_dataset(db_url, cap=100.0)
    seed_ratings(db_url, "default", synthetic_ratings())
    client, admin, settings = _client(tmp_path, db_url, "redis://127.0.0.1:9/0")  # broker down: the outbox
    body = {"epsilon": 1.0, "hyperparameters": HYPER, "idempotency_key": "once"}
    first = client.post(TRAININGS, headers=admin, json=body)
    assert first.status_code == 202 and first.json()["status"] == "queued", first.text
    run_id = first.json()["run_id"]
    assert runner.run_training(run_id, url=db_url, settings=settings) == "succeeded"

    replay = client.post(TRAININGS, headers=admin, json=body)
    assert replay.status_code == 202
    assert replay.json() == {**first.json(), "status": "succeeded", "enqueued": False}
    other = client.post(TRAININGS, headers=admin, json={**body, "epsilon": 2.0})
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    other = client.post(TRAININGS, headers=admin, json={**body, "algorithm": "dpcmf"})
    assert other.status_code == 409
    assert _reservations(db_url) == 1


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_blind_retry_without_a_key_is_charged_once(db_url, tmp_path):
    create_dataset(db_url, cap=100.0)
    seed_ratings(db_url, "default", synthetic_ratings())
    client, admin, _ = _client(tmp_path, db_url, "redis://127.0.0.1:9/0")
    body = {"epsilon": 1.0, "hyperparameters": HYPER}
    first = client.post(TRAININGS, headers=admin, json=body)
    retry = client.post(TRAININGS, headers=admin, json=body)
    assert first.status_code == retry.status_code == 202, (first.text, retry.text)
    assert retry.json()["run_id"] == first.json()["run_id"]
    changed = client.post(TRAININGS, headers=admin, json={**body, "epsilon": 1.5})
    assert changed.status_code == 202 and changed.json()["run_id"] != first.json()["run_id"]
    assert _reservations(db_url) == 2


SPREAD = {"count_noise_ratio": 1e3, "gram_noise_ratio": 1e-3, "gravity_noise_ratio": 1e-3,
          "mean_noise_ratio": 1e-3, "bias_noise_ratio": 1e-3, "rank": 512}


def test_every_start_path_checks_the_sampler_range_before_the_reservation(db_url, tmp_path):
    """The CLI's and scheduler's entry point (``submit_training``), not only the API route."""
    create_dataset(db_url, cap=100.0)
    seed_ratings(db_url, "default", synthetic_ratings(n_users=30, n_items=24, n_ratings=200))
    settings = make_settings(tmp_path, db_url)
    with pytest.raises(InvalidHyperparameters, match="sampler"):
        requests.submit_training(settings=settings, url=db_url, dataset="default", algorithm="dpals",
                                 epsilon=0.01, hyperparameters=SPREAD, actor="cli")
    with session_scope(db_url) as s:
        assert s.scalar(select(func.count()).select_from(TrainingRun)) == 0
    assert _reservations(db_url) == 0
