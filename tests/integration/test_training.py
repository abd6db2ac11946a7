"""Training pipeline on SQLite and PostgreSQL: reserve -> train (DPALS) -> publish, failures,
redelivery, rollback, scheduled retraining and the embedded worker."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import func, select

from app import ledger, model_store
from app.core.privacy.accounting import epsilon_rdp, event_to_json
from app.db.models import LedgerEntry, ModelVersion, TrainingRun
from app.db.session import session_scope
from app.errors import BudgetExceeded, InvalidRequest, NoActiveModel
from app.services import admin, budget, bulk_read
from app.services.training import dispatch, runner, schedule
from app.services.training import requests as train_requests
from app.services.training.embedded_worker import start_embedded_worker
from tests.integration.platform_helpers import create_dataset, schedule_clock, seed_ratings, synthetic_ratings

HYPER = {"rank": 4, "n_steps": 2, "contribution_bound": 20}


def _start(url: str, **kw) -> int:
    args = dict(dataset="default", epsilon=2.0, hyperparameters=HYPER, actor="admin")
    args.update(kw)
    with session_scope(url) as s:
        return train_requests.start_training(s, **args).id


def _run(url, run_id) -> TrainingRun:
    with session_scope(url) as s:
        run = s.get(TrainingRun, run_id)
        _ = run.dataset
        return run


def _kinds(url, run_id) -> list[str]:
    with session_scope(url) as s:
        return list(s.scalars(select(LedgerEntry.kind).where(LedgerEntry.run_id == run_id).order_by(LedgerEntry.seq)))


@pytest.fixture
def seeded(db_url):
    create_dataset(db_url, cap=10.0)
    seed_ratings(db_url, "default", synthetic_ratings())
    model_store.clear_cache()
    return db_url


def test_train_publish_and_serve(seeded, settings):
    url = seeded
    run_id = _start(url)
    with session_scope(url) as s:
        view = budget.get_budget(s, dataset="default")
        reserved = ledger.reservation_for(s, run_id)
        assert view.runs["queued"] == 1
        assert view.spent_epsilon_rdp == ledger.round_up(reserved.spent_rdp)
        assert reserved.epsilon <= 2.0 + 1e-9  # calibrated to the requested epsilon
        assert reserved.parameters["contribution_bound"] == 20
        with pytest.raises(NoActiveModel):
            model_store.get_active_model(s, "default")
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    run = _run(url, run_id)
    assert (run.status, run.progress, run.refunded, run.private_data_read) == ("succeeded", 1.0, False, True)
    assert "seed" not in run.config
    assert _kinds(url, run_id) == ["reservation", "commit"]
    with session_scope(url) as s:
        row, model = model_store.get_active_model(s, "default")
        assert row.run_id == run_id and row.active
        assert model.algorithm == "dpals" and model.rank == 4
        assert "seed" not in model.config  # the noise seed never leaves the worker
        assert set(model.item_ids.tolist()) == {f"i{x}" for x in range(60)}
        assert event_to_json(model.event) == ledger.reservation_for(s, run_id).event
        assert row.epsilon == pytest.approx(epsilon_rdp(model.event, row.delta))
        assert row.metrics["n_trained_items"] == int(model.trained_mask.sum())
        info = admin.version_out(row).model_dump()
        assert info["active"] and info["sha256"] == row.sha256
        # the ledger's spend equals the RDP epsilon of the composed reservations (one run)
        assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == ledger.round_up(row.epsilon)
        assert ledger.verify_chain(s, ledger.account_for(s, row.dataset_id).id, recompute_spend=True).ok


def test_redelivered_run_charges_once(seeded, settings):
    url = seeded
    run_id = _start(url)
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp
    for _ in range(2):  # the broker delivers the same task again
        assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    assert _kinds(url, run_id) == ["reservation", "commit"]
    with session_scope(url) as s:
        assert s.scalar(select(func.count()).select_from(ModelVersion)) == 1
        assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == spent
        assert s.get(TrainingRun, run_id).attempts == 1


def test_idempotency_key_returns_the_same_run(seeded):
    a = _start(seeded, idempotency_key="req-1")
    b = _start(seeded, idempotency_key="req-1")
    assert a == b
    assert _kinds(seeded, a) == ["reservation"]


def _items_only(url: str) -> None:
    """A data set with a public catalogue of 60 items and no ratings at all."""
    empty = synthetic_ratings()
    seed_ratings(url, "default", type(empty).from_arrays(
        np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), item_ids=empty.item_ids))


@pytest.mark.parametrize("algorithm", ["dpals", "dpfw", "dpcmf"])
def test_empty_dataset_trains_a_noise_only_model_and_is_charged(db_url, settings, algorithm):
    """No ratings is not a refusal (that would answer "is the data set empty?" for free): every
    release is made on the empty matrix, the model is published and the run is charged."""
    create_dataset(db_url, cap=10.0)
    _items_only(db_url)
    hyper = HYPER if algorithm != "dpfw" else {"n_steps": 3}
    run_id = _start(db_url, algorithm=algorithm, hyperparameters=hyper)
    assert runner.run_training(run_id, url=db_url, settings=settings) == "succeeded"
    run = _run(db_url, run_id)
    assert run.private_data_read and not run.refunded and run.error is None
    assert _kinds(db_url, run_id) == ["reservation", "commit"]
    with session_scope(db_url) as s:
        row, model = model_store.get_active_model(s, "default")
        assert row.run_id == run_id and model.n_items == 60
        assert budget.get_budget(s, dataset="default").spent_epsilon_rdp > 0


def test_a_catalogue_without_items_is_refused_before_anything_is_reserved(db_url):
    create_dataset(db_url, cap=10.0)  # the catalogue is public: refusing on it reveals nothing
    with session_scope(db_url) as s, pytest.raises(InvalidRequest, match="item"):
        train_requests.start_training(s, dataset="default", epsilon=1.0, actor="admin")
    with session_scope(db_url) as s:
        assert budget.get_budget(s, dataset="default").n_entries == 1  # the account's opening entry only


def test_failure_after_the_private_read_is_charged_and_names_only_a_category(seeded, settings, monkeypatch, caplog):
    """A numpy MemoryError's text carries array shapes (counts): once private data was read the
    run is charged, never refunded, and neither its error row nor the log holds that text."""
    import logging

    from app.core import algorithms

    def out_of_memory(ratings, config, **_):
        raise MemoryError(f"Unable to allocate array with shape ({ratings.n_users}, {ratings.nnz}) and data type float64")

    monkeypatch.setattr(algorithms.ALGORITHMS["dpals"], "train", out_of_memory)
    run_id = _start(seeded)
    with session_scope(seeded) as s:
        n_ratings = s.scalar(select(func.count()).select_from(__import__("app.db.models", fromlist=["Rating"]).Rating))
    with caplog.at_level(logging.DEBUG):
        assert runner.run_training(run_id, url=seeded, settings=settings) == "failed"
    run = _run(seeded, run_id)
    assert run.status == "failed" and run.private_data_read and not run.refunded
    assert "out_of_memory" in run.error and "charged" in run.error
    assert "shape" not in run.error and str(n_ratings) not in run.error and run.stage == "failed"
    assert "shape" not in caplog.text and str(n_ratings) not in caplog.text
    assert _kinds(seeded, run_id) == ["reservation"]  # spent, no refund
    with session_scope(seeded) as s:
        assert budget.get_budget(s, dataset="default").spent_epsilon_rdp > 0


def test_failure_before_the_private_read_is_refunded(seeded, settings):
    """A failure decided from public facts only (the config no longer matches the reservation)
    happens before private_data_read and is refunded, with its reason."""
    run_id = _start(seeded)
    with session_scope(seeded) as s:
        run = s.get(TrainingRun, run_id)
        run.config = {**run.config, "noise_multiplier": run.config["noise_multiplier"] / 2}
    assert runner.run_training(run_id, url=seeded, settings=settings) == "failed"
    run = _run(seeded, run_id)
    assert run.refunded and not run.private_data_read and "no longer matches" in run.error
    assert _kinds(seeded, run_id) == ["reservation", "refund"]
    with session_scope(seeded) as s:
        view = budget.get_budget(s, dataset="default")
        assert view.spent_epsilon_rdp == 0.0 and view.remaining_epsilon == 10.0


def test_bad_training_requests_write_nothing(seeded):
    for kwargs in (
        dict(epsilon=-1.0),
        dict(epsilon=float("nan")),
        dict(epsilon=1.0, epsilon_fraction=0.5),
        dict(epsilon=None, epsilon_fraction=1.5),
        dict(algorithm="nope"),
        dict(hyperparameters={"rank": 0}),
        dict(hyperparameters={"bogus": 1}),
        dict(hyperparameters={"seed": 7}),
        dict(hyperparameters={"rating_range": [0, 10]}),
    ):
        with pytest.raises(InvalidRequest):
            _start(seeded, **kwargs)
    with pytest.raises(BudgetExceeded) as info:
        _start(seeded, epsilon=50.0)
    assert info.value.details["requested_epsilon"] > 10.0
    with session_scope(seeded) as s:
        assert s.scalar(select(func.count()).select_from(TrainingRun)) == 0
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 1  # just "open"


def test_fraction_of_remaining_budget(seeded):
    run_id = _start(seeded, epsilon=None, epsilon_fraction=1.0)
    with session_scope(seeded) as s:
        view = budget.get_budget(s, dataset="default")
        assert 9.99 < view.spent_epsilon_rdp <= 10.0
        assert view.remaining_epsilon >= 0.0
    with pytest.raises(BudgetExceeded):
        _start(seeded, epsilon=None, epsilon_fraction=0.5)
    assert _kinds(seeded, run_id) == ["reservation"]


def test_rollback_and_cache_pick_up_new_versions(seeded, settings):
    url = seeded
    first = _start(url)
    assert runner.run_training(first, url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        v1, m1 = model_store.get_active_model(s, "default")
    second = _start(url)
    assert runner.run_training(second, url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        v2, m2 = model_store.get_active_model(s, "default")  # no restart, no cache flush
        assert v2.id != v1.id and v2.run_id == second
        assert not np.array_equal(m1.item_factors, m2.item_factors)
        model_store.activate_version(s, "default", v1.id, actor="admin")
    with session_scope(url) as s:
        row, model = model_store.get_active_model(s, "default")
        assert row.id == v1.id
        assert np.array_equal(model.item_factors, m1.item_factors)
        rows, total = model_store.list_versions(s, "default")
        assert total == 2 and [r.active for r in rows] == [False, True]


def test_tampered_artifact_is_refused(seeded, settings):
    run_id = _start(seeded)
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"
    model_store.clear_cache()
    with session_scope(seeded) as s:
        row = model_store.get_active_version(s, "default")
        path = row.artifact_path
    with open(path, "r+b") as fh:
        fh.seek(-20, 2)
        fh.write(b"\x00" * 8)
    with session_scope(seeded) as s, pytest.raises(Exception, match="altered|unreadable"):
        model_store.get_active_model(s, "default")


def test_stale_running_run_fails_closed(seeded, settings):
    url = seeded
    published = _start(url)
    assert runner.run_training(published, url=url, settings=settings) == "succeeded"
    run_id = _start(url)
    with session_scope(url) as s:  # a worker claimed it and then vanished
        run = s.get(TrainingRun, run_id)
        run.status, run.started_at, run.heartbeat_at, run.attempts = "running", None, None, 1
        spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp
    # a redelivered task finds it stale and fails it without refund
    assert runner.run_training(run_id, url=url, settings=settings) == "failed"
    run = _run(url, run_id)
    assert run.status == "failed" and not run.refunded and "vanished" in run.error
    assert _kinds(url, run_id) == ["reservation"]
    with session_scope(url) as s:
        assert budget.get_budget(s, dataset="default").spent_epsilon_rdp == spent
        assert model_store.get_active_version(s, "default").run_id == published


def test_live_running_run_is_not_taken_over(seeded, settings):
    run_id = _start(seeded)
    with session_scope(seeded) as s:
        run = s.get(TrainingRun, run_id)
        run.status = "running"
        run.started_at = run.heartbeat_at = __import__("app.db.models", fromlist=["utcnow"]).utcnow()
    assert runner.run_training(run_id, url=seeded, settings=settings) == "busy"
    assert runner.reap_stale_runs(url=seeded, settings=settings) == []
    time.sleep(settings.run_stale_after_s + 0.5)
    assert runner.reap_stale_runs(url=seeded, settings=settings) == [run_id]
    run = _run(seeded, run_id)
    assert run.status == "failed" and not run.refunded


def test_scheduled_retrain_decides_from_public_facts_only(db_url, settings):
    """Whether and what the scheduler trains never depends on the data: an empty data set and
    an unchanged one are retrained like any other (budget permitting); only runs in flight and
    the budget (public) skip."""
    url = db_url
    create_dataset(url, cap=3.0)
    _items_only(url)
    clock = schedule_clock(settings)  # one retrain interval between ticks: each is due
    sched = lambda: schedule.scheduled_retrain(url=url, settings=settings, enqueue=False, now=clock())["default"]  # noqa: E731
    out = sched()  # no ratings at all: still a run (noise-only model)
    assert out.startswith("started:")
    run_id = int(out.split(":")[1])
    assert sched() == "skipped:busy"
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    seed_ratings(url, "default", synthetic_ratings())
    out = sched()
    assert out.startswith("started:")
    assert runner.run_training(int(out.split(":")[1]), url=url, settings=settings) == "succeeded"
    out = sched()  # nothing changed since: retrained all the same
    assert out.startswith("started:")
    assert runner.run_training(int(out.split(":")[1]), url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp
        budget.change_cap(s, dataset="default", new_cap=spent + 0.05, reason=None, actor="admin")
    with session_scope(url) as s:
        before = budget.get_budget(s, dataset="default")
    assert sched() == "skipped:budget"
    with session_scope(url) as s:
        after = budget.get_budget(s, dataset="default")
        assert after.n_entries == before.n_entries and after.runs == before.runs


@pytest.mark.timeout(120)
def test_embedded_worker_runs_queued_trainings(seeded, settings):
    worker = start_embedded_worker(settings, url=seeded, schedule=False)
    try:
        run_id = train_requests.submit_training(
            url=seeded, settings=settings, dataset="default", epsilon=1.0, hyperparameters=HYPER, actor="admin"
        )
        deadline = time.monotonic() + 90
        while _run(seeded, run_id).status in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.stop()
    assert _run(seeded, run_id).status == "succeeded"
    assert worker.completed == [(run_id, "succeeded")]
    with session_scope(seeded) as s:
        assert model_store.get_active_version(s, "default").run_id == run_id


def test_outbox_sends_unsent_runs_and_resends_lost_ones_at_most_once_per_period(seeded, settings):
    run_id = _start(seeded)  # committed, never handed to a broker: in the outbox
    assert _run(seeded, run_id).enqueued_at is None
    assert dispatch.drain_outbox(url=seeded, settings=settings, older_than_s=3600) == [run_id]
    assert _run(seeded, run_id).enqueued_at is not None
    assert dispatch.drain_outbox(url=seeded, settings=settings, older_than_s=3600) == []
    assert dispatch.drain_outbox(url=seeded, settings=settings, older_than_s=0) == [run_id]  # lost message
    assert dispatch.drain_outbox(url=seeded, settings=settings, older_than_s=5) == []
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"
    assert dispatch.drain_outbox(url=seeded, settings=settings, older_than_s=0) == []


def test_worker_startup_reaps_its_dead_incarnations_runs_at_once(seeded, settings):
    """A killed worker's run does not wait for a stale heartbeat (or a beat) when the same node
    starts again; another live worker's run is left alone."""
    from app.db.models import utcnow

    mine, other = _start(seeded), _start(seeded)
    with session_scope(seeded) as s:
        for run_id, worker in ((mine, "celery:w1@host:task-a"), (other, "celery:w2@host:task-b")):
            run = s.get(TrainingRun, run_id)
            run.status, run.worker, run.attempts = "running", worker, 1
            run.started_at = run.heartbeat_at = utcnow()  # fresh heartbeats
    out = schedule.worker_startup("celery:w1@host:", url=seeded, settings=settings)
    assert out["reaped"] == [mine]
    assert _run(seeded, mine).status == "failed" and "vanished" in _run(seeded, mine).error
    assert _run(seeded, mine).private_data_read and not _run(seeded, mine).refunded
    assert _run(seeded, other).status == "running"
    assert _kinds(seeded, mine) == ["reservation"]


def test_load_ratings_round_trips_the_stored_ratings(db_url):
    create_dataset(db_url)
    original = synthetic_ratings(seed=3)
    seed_ratings(db_url, "default", original)
    with session_scope(db_url) as s:
        loaded = bulk_read.load_ratings(s, budget.get_dataset(s, "default"))
    assert loaded.nnz == original.nnz and loaded.n_items == original.n_items

    def triples(r, item_name):
        rows, cols, vals = r.coo()
        names = [item_name(r.item_ids[c]) for c in cols]
        return sorted(zip(np.asarray(rows).tolist(), names, np.asarray(vals).tolist(), strict=True))

    # users are internal ids after loading: compare per-item multisets of values and the per-user counts
    orig = triples(original, lambda x: f"i{x}")
    got = triples(loaded, str)
    assert sorted((i, v) for _, i, v in orig) == sorted((i, v) for _, i, v in got)
    assert sorted(np.diff(original.csr.indptr).tolist()) == sorted(np.diff(loaded.csr.indptr).tolist())


def test_concurrent_first_requests_load_a_version_once(seeded, settings, monkeypatch):
    """A cold process's concurrent first requests wait for one load of the artifact (single
    flight) and all get that model."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from app.core import algorithms

    run_id = _start(seeded)
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"
    model_store.clear_cache()
    with session_scope(seeded) as s:
        row = model_store.get_active_version(s, "default")
        s.expunge(row)
    algorithm = algorithms.get_algorithm(row.algorithm)
    loads, started = [], threading.Barrier(8)
    original = type(algorithm).load

    def slow_load(self, path, sha256):
        loads.append(path)
        return original(self, path, sha256)

    monkeypatch.setattr(type(algorithm), "load", slow_load)

    def first_request(_):
        started.wait()
        return model_store.load_version_model(row)

    with ThreadPoolExecutor(max_workers=8) as pool:
        models = list(pool.map(first_request, range(8)))
    assert len(loads) == 1
    assert all(m is models[0] for m in models)
