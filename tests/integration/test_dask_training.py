"""The service trains on a Dask cluster when DASK_SCHEDULER_ADDRESS is set (issue 28, items 3-4).

Real components: PostgreSQL, the runner the Celery task runs, a ``LocalCluster`` of two worker
processes. With the run's secret seed pinned, a run on the cluster publishes the model an
in-process run publishes, charged once, through the same outbox and ledger path. A worker killed
(SIGKILL) after the first step: the run completes with the in-process model, or fails closed,
charged once and never published; a cluster left without any worker fails it closed. Cluster
mode refuses the embedded SQLite database and an unreachable scheduler before anything is read
(refunded). Needs the optional ``dask`` extra.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from app import model_store
from app.config import Settings
from app.db.models import LedgerEntry, ModelVersion, TrainingRun
from app.db.session import session_scope
from app.services.training import requests as train_requests
from app.services.training import runner
from tests.integration.platform_helpers import create_dataset, make_settings, seed_ratings, synthetic_ratings

distributed = pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")

pytestmark = pytest.mark.integration

SEED = (1 << 127) + 12345


@pytest.fixture
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as local:
        yield local


@pytest.fixture
def seeded(pg_url, monkeypatch):
    create_dataset(pg_url, cap=10.0)
    seed_ratings(pg_url, "default", synthetic_ratings())
    model_store.clear_cache()
    monkeypatch.setattr(runner.secrets, "randbits", lambda bits: SEED)  # both runs draw the same noise
    return pg_url


def _start(url: str) -> int:
    with session_scope(url) as s:  # no hyperparameters: the default rule (the bound histogram, the user-level mean)
        return train_requests.start_training(s, dataset="default", epsilon=2.0, actor="admin").id


def _published(url: str, run_id: int):
    with session_scope(url) as s:
        row = s.scalar(select(ModelVersion).where(ModelVersion.run_id == run_id))
        return None if row is None else model_store.load_version_model(row)


def _kinds(url: str, run_id: int) -> list[str]:
    with session_scope(url) as s:
        return list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id).order_by(LedgerEntry.seq)))


def _run(url: str, run_id: int) -> TrainingRun:
    with session_scope(url) as s:
        return s.get_one(TrainingRun, run_id)


def _assert_same_model(got, want) -> None:
    for name in ("item_factors", "item_biases", "item_counts", "trained_mask"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    assert got.global_mean == want.global_mean and got.event == want.event
    assert got.metadata["releases"] == want.metadata["releases"] and got.config == want.config


def _in_process_reference(url: str, tmp_path) -> object:
    run_id = _start(url)
    assert runner.run_training(run_id, url=url, settings=make_settings(tmp_path, url)) == "succeeded"
    return _published(url, run_id)


def test_a_cluster_run_publishes_the_in_process_model_charged_once(seeded, cluster, tmp_path):
    reference = _in_process_reference(seeded, tmp_path)
    assert reference.metadata["releases"][0]["name"] == "bound_histogram"
    settings = make_settings(tmp_path, seeded, dask_scheduler_address=cluster.scheduler_address)
    run_id = _start(seeded)
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"
    _assert_same_model(_published(seeded, run_id), reference)
    assert "read_task" in cluster.scheduler.task_prefixes  # the workers read the partitions themselves
    run = _run(seeded, run_id)
    assert (run.status, run.progress, run.private_data_read, run.refunded) == ("succeeded", 1.0, True, False)
    assert _kinds(seeded, run_id) == ["reservation", "commit"]
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"  # redelivered: a no-op
    assert _kinds(seeded, run_id) == ["reservation", "commit"]


def test_a_worker_lost_mid_run_completes_or_fails_closed(seeded, cluster, tmp_path, monkeypatch):
    reference = _in_process_reference(seeded, tmp_path)
    settings = make_settings(tmp_path, seeded, dask_scheduler_address=cluster.scheduler_address)
    killed: list[int] = []
    write_progress = runner._progress_writer

    def killing_writer(run_id, url, guard):
        write = write_progress(run_id, url, guard)

        def progress(fraction: float, stage: str) -> None:
            if stage.startswith("step 1/") and not killed:  # after the first step: SIGKILL one worker process
                with distributed.Client(cluster, set_as_default=False) as client:
                    pid = next(iter(client.run(os.getpid).values()))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            write(fraction, stage)

        return progress

    monkeypatch.setattr(runner, "_progress_writer", killing_writer)
    run_id = _start(seeded)
    outcome = runner.run_training(run_id, url=seeded, settings=settings)
    assert killed, "the hook never ran: the test proves nothing"
    run = _run(seeded, run_id)
    assert run.private_data_read and not run.refunded  # charged once, whatever happened
    if outcome == "succeeded":  # Dask recomputed what was lost: the same bits
        _assert_same_model(_published(seeded, run_id), reference)
        assert _kinds(seeded, run_id) == ["reservation", "commit"]
    else:  # failed closed: charged, nothing published, a fixed category only
        assert outcome == "failed" and run.status == "failed" and "charged" in run.error
        assert _published(seeded, run_id) is None
        assert _kinds(seeded, run_id) == ["reservation"]
    with session_scope(seeded) as s:
        assert s.scalar(select(func.count()).select_from(ModelVersion)) == (2 if outcome == "succeeded" else 1)


def test_a_cluster_left_without_workers_fails_the_run_closed(seeded, cluster, tmp_path, monkeypatch):
    """Every worker retired after the first step: nothing can compute the next statistic; the run
    waits DASK_RESULT_TIMEOUT_S, then fails charged (it read the data), with nothing published."""
    settings = make_settings(tmp_path, seeded, dask_scheduler_address=cluster.scheduler_address,
                             dask_result_timeout_s=3.0)
    write_progress = runner._progress_writer

    def emptying_writer(run_id, url, guard):
        write = write_progress(run_id, url, guard)

        def progress(fraction: float, stage: str) -> None:
            if stage.startswith("step 1/"):
                cluster.scale(0)
            write(fraction, stage)

        return progress

    monkeypatch.setattr(runner, "_progress_writer", emptying_writer)
    run_id = _start(seeded)
    assert runner.run_training(run_id, url=seeded, settings=settings) == "failed"
    run = _run(seeded, run_id)
    assert run.status == "failed" and run.private_data_read and not run.refunded and "charged" in run.error
    assert _published(seeded, run_id) is None and _kinds(seeded, run_id) == ["reservation"]


def test_cluster_mode_refuses_sqlite_before_anything_is_read(sqlite_url, tmp_path):
    with pytest.raises(ValidationError, match="SQLite"):
        Settings(database_url=sqlite_url, dask_scheduler_address="tcp://127.0.0.1:8786", artifact_dir=tmp_path)
    create_dataset(sqlite_url, cap=10.0)
    seed_ratings(sqlite_url, "default", synthetic_ratings())
    run_id = _start(sqlite_url)
    # settings naming PostgreSQL, the run handed an SQLite URL: refused at the public checks, refunded
    settings = make_settings(tmp_path, "postgresql://nowhere/none", dask_scheduler_address="tcp://127.0.0.1:1")
    assert runner.run_training(run_id, url=sqlite_url, settings=settings) == "failed"
    run = _run(sqlite_url, run_id)
    assert not run.private_data_read and run.refunded and "SQLite" in run.error
    assert _kinds(sqlite_url, run_id) == ["reservation", "refund"]


def test_an_unreachable_scheduler_fails_the_run_before_the_private_read(seeded, tmp_path):
    settings = make_settings(tmp_path, seeded, dask_scheduler_address="tcp://127.0.0.1:9", dask_connect_timeout_s=1.0)
    run_id = _start(seeded)
    assert runner.run_training(run_id, url=seeded, settings=settings) == "failed"
    run = _run(seeded, run_id)
    assert not run.private_data_read and run.refunded
    assert _kinds(seeded, run_id) == ["reservation", "refund"]


def test_the_tls_files_go_together_and_need_a_tls_address(tmp_path):
    pem = tmp_path / "x.pem"
    with pytest.raises(ValidationError, match="go together"):
        make_settings(tmp_path, "postgresql://h/db", dask_scheduler_address="tls://s:8786", dask_tls_ca_file=pem)
    with pytest.raises(ValidationError, match="tls://"):
        make_settings(tmp_path, "postgresql://h/db", dask_scheduler_address="tcp://s:8786", dask_tls_ca_file=pem,
                      dask_tls_cert_file=pem, dask_tls_key_file=pem)
