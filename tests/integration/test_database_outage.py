"""A short PostgreSQL outage during a training run is ridden out, not a failed run: connections
refused and the live ones terminated while the run trains, then allowed again; the run succeeds
and is charged once. The outage helper itself is checked on the same kind of outage."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from sqlalchemy import select, text

from app.db.models import LedgerEntry, TrainingRun
from app.db.session import ride_out_outage, session_scope
from app.services.training import requests as train_requests
from app.services.training import runner
from tests.integration.platform_helpers import create_dataset, make_settings, seed_ratings, synthetic_ratings

OUTAGE_S = 2.0


def _database_down(url: str):
    """Refuse new connections to the test database and terminate its live ones; returns the
    function that ends the outage."""
    name = url.rsplit("/", 1)[1]
    admin = psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True)
    admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))

    def up() -> None:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        admin.close()

    return up


def _after(seconds: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    thread.start()
    return thread


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_write_rides_out_a_short_outage(pg_url):
    with session_scope(pg_url) as s:
        assert s.execute(text("SELECT 1")).scalar_one() == 1  # a pooled connection, killed below
    restore = _after(OUTAGE_S, _database_down(pg_url))

    def read() -> int:
        with session_scope(pg_url) as s:
            return int(s.execute(text("SELECT 2")).scalar_one())

    assert ride_out_outage(read, within_s=30.0, first_pause_s=0.2) == 2
    restore.join()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_run_rides_out_a_short_database_outage(pg_url, tmp_path):
    settings = make_settings(tmp_path, pg_url, run_heartbeat_s=0.5, run_stale_after_s=60.0)
    create_dataset(pg_url, cap=10.0)
    seed_ratings(pg_url, "default", synthetic_ratings(n_users=3000, n_items=150, n_ratings=60_000))
    run_id = train_requests.submit_training(settings=settings, url=pg_url, dataset="default", epsilon=1.0,
                                            hyperparameters={"rank": 16, "n_steps": 20}, actor="admin")
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(runner.run_training(run_id, url=pg_url, settings=settings)))
    worker.start()
    while True:  # wait until the run reads or trains, then take the database away
        with session_scope(pg_url) as s:
            run = s.get(TrainingRun, run_id)
            assert run is not None
            if run.status != "queued" or not worker.is_alive():
                break
        time.sleep(0.05)
    assert run.status == "running", run.status
    restore = _after(OUTAGE_S, _database_down(pg_url))
    worker.join()
    restore.join()
    assert outcome == ["succeeded"]
    with session_scope(pg_url) as s:
        kinds = sorted(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id)))
        assert kinds == ["commit", "reservation"]
