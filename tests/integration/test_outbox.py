"""Broker outage: a training request is one outcome (recorded, reserved, in the outbox), never a
500 after the reservation that invites a second, charged request; the outbox is sent once the
broker is back. A real Redis: "down" is REDIS_URL pointing at a closed port."""

from __future__ import annotations

import secrets
import sqlite3
import time
from datetime import timedelta

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.auth import issue_token
from app.db.models import LedgerEntry, TrainingRun, utcnow
from app.db.session import dispose_engines, session_scope
from app.main import create_app
from app.services.training import dispatch, runner
from app.services.training import requests as train_requests
from tests.integration.platform_helpers import create_dataset, make_settings, seed_ratings, synthetic_ratings

CLOSED = "redis://127.0.0.1:9/0"
HYPER = {"rank": 4, "n_steps": 2, "contribution_bound": 20}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_broker_down_training_is_recorded_once_and_sent_when_the_broker_is_back(db_url, redis_url, tmp_path):
    secret = secrets.token_hex(24)
    down = make_settings(tmp_path, db_url, redis_url=CLOSED, secret_key=secret)
    create_dataset(db_url, cap=10.0)
    seed_ratings(db_url, "default", synthetic_ratings())
    admin = {"Authorization": f"Bearer {issue_token('root', secret=secret, kind='admin', ttl_seconds=600)}"}
    client = TestClient(create_app(down))  # production mode, no lifespan: the database is migrated already

    started = time.monotonic()
    r = client.post("/v1/admin/datasets/default/trainings", headers=admin,
                    json={"epsilon": 1.0, "hyperparameters": HYPER})
    assert r.status_code == 202, r.text
    assert time.monotonic() - started < 30  # the broker's retry loop does not hold the request
    body = r.json()
    run_id = body["run_id"]
    assert body["status"] == "queued" and body["enqueued"] is False
    view = client.get(f"/v1/admin/trainings/{run_id}", headers=admin).json()
    assert view["status"] == "queued" and view["enqueued"] is False and not view["private_data_read"]
    with session_scope(db_url) as s:
        kinds = list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id)))
        assert kinds == ["reservation"] and s.get(TrainingRun, run_id).enqueued_at is None
    assert client.get("/ready").status_code == 503
    assert dispatch.drain_outbox(url=db_url, settings=down) == []  # still down: stays in the outbox

    up = make_settings(tmp_path, db_url, redis_url=redis_url, secret_key=secret)
    assert dispatch.drain_outbox(url=db_url, settings=up) == [run_id]
    broker = redis.Redis.from_url(redis_url)
    try:
        assert broker.llen(dispatch.QUEUE) == 1  # the message is with the broker, once
    finally:
        broker.delete(dispatch.QUEUE)
        broker.close()
    with session_scope(db_url) as s:
        assert s.get(TrainingRun, run_id).enqueued_at is not None
    assert dispatch.drain_outbox(url=db_url, settings=up) == []
    assert runner.run_training(run_id, url=db_url, settings=up) == "succeeded"
    with session_scope(db_url) as s:
        kinds = list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id).order_by(LedgerEntry.seq)))
        assert kinds == ["reservation", "commit"]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_run_lost_with_a_restarted_broker_is_sent_again_once(db_url, redis_url, tmp_path):
    """A non-persistent Redis that restarts loses the queued messages: a queued run sent more than
    REQUEUE_AFTER_S (a minute) ago whose message the broker no longer holds is sent again, once;
    one whose message still waits in the queue is not (keyed by run)."""
    settings = make_settings(tmp_path, db_url, redis_url=redis_url, secret_key=secrets.token_hex(24))
    create_dataset(db_url, cap=10.0)
    seed_ratings(db_url, "default", synthetic_ratings())
    first, second = (train_requests.submit_training(settings=settings, url=db_url, dataset="default", epsilon=1.0,
                                                    hyperparameters={**HYPER, "rank": rank}, actor="admin")
                     for rank in (4, 5))
    broker = redis.Redis.from_url(redis_url)
    try:
        assert broker.llen(dispatch.QUEUE) == 2
        assert dispatch.runs_with_broker(redis_url) == {first, second}
        _sent_minutes_ago(db_url, 2)
        assert dispatch.drain_outbox(url=db_url, settings=settings) == []  # both still with the broker
        broker.rpop(dispatch.QUEUE)  # the oldest message (first's; kombu pushes left, pops right) lost
        broker.delete("unacked")
        assert dispatch.runs_with_broker(redis_url) == {second}
        assert dispatch.drain_outbox(url=db_url, settings=settings) == [first]
        broker.flushdb()  # the broker restarts empty
        assert dispatch.drain_outbox(url=db_url, settings=settings) == [second]  # first was sent just now
        _sent_minutes_ago(db_url, 2)
        assert dispatch.drain_outbox(url=db_url, settings=settings) == [first]
        assert broker.llen(dispatch.QUEUE) == 2  # one message per run
        assert dispatch.REQUEUE_AFTER_S <= 60
    finally:
        broker.delete(dispatch.QUEUE)
        broker.close()
    assert runner.run_training(first, url=db_url, settings=settings) == "succeeded"
    assert runner.run_training(first, url=db_url, settings=settings) == "succeeded"  # a duplicate: a no-op
    with session_scope(db_url) as s:
        kinds = list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == first)))
        assert sorted(kinds) == ["commit", "reservation"]


def _sent_minutes_ago(db_url: str, minutes: int) -> None:
    with session_scope(db_url) as s:
        s.execute(update(TrainingRun).where(TrainingRun.status == "queued")
                  .values(enqueued_at=utcnow() - timedelta(minutes=minutes)))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_sent_run_whose_enqueued_mark_meets_a_locked_database_is_left_to_the_outbox(sqlite_url, redis_url,
                                                                                    tmp_path):
    """After the reservation commits, marking the run enqueued is a second transaction: when it
    meets SQLite's write lock held past the busy timeout, sending still answers True (the message
    is out; the request's answer is 202), the run stays in the outbox and is sent once more, and
    the duplicate trains and charges nothing twice (the claim is idempotent)."""
    create_dataset(sqlite_url, cap=10.0)
    seed_ratings(sqlite_url, "default", synthetic_ratings())
    with session_scope(sqlite_url) as s:
        run_id = train_requests.start_training(s, dataset="default", algorithm="dpals", epsilon=1.0,
                                               hyperparameters=HYPER, actor="test").id
    dispose_engines()  # the next engine is built with the short busy timeout below
    settings = make_settings(tmp_path, sqlite_url, redis_url=redis_url, sqlite_busy_timeout_ms=50,
                             secret_key=secrets.token_hex(24))
    locker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    broker = redis.Redis.from_url(redis_url)
    try:
        locker.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
        assert dispatch.enqueue_run(run_id, settings=settings, url=sqlite_url) is True
        locker.execute("ROLLBACK")
        assert broker.llen(dispatch.QUEUE) == 1
        with session_scope(sqlite_url) as s:
            assert s.get(TrainingRun, run_id).enqueued_at is None  # still in the outbox
        assert dispatch.drain_outbox(url=sqlite_url, settings=settings) == [run_id]
        assert broker.llen(dispatch.QUEUE) == 2  # sent once more: harmless
        assert dispatch.drain_outbox(url=sqlite_url, settings=settings) == []  # marked this time
    finally:
        locker.close()
        broker.delete(dispatch.QUEUE)
        broker.close()
    assert runner.run_training(run_id, url=sqlite_url, settings=settings) == "succeeded"
    runner.run_training(run_id, url=sqlite_url, settings=settings)  # the duplicate message: a no-op
    with session_scope(sqlite_url) as s:
        kinds = list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id).order_by(LedgerEntry.seq)))
        assert kinds == ["reservation", "commit"]
