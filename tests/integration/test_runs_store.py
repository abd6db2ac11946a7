"""The runs store (app.db.stores.runs) keeps one contract on PostgreSQL and SQLite: the outbox,
the heartbeat board, the point of no refund and the data set facts training reads."""

from __future__ import annotations

from app.db.models import Item, TrainingRun
from app.db.session import session_scope
from app.db.stores.runs import PostgresRunsStore, SqliteRunsStore, runs_store
from tests.integration.platform_helpers import create_dataset


def _run(dataset_id: int, status: str, key: str | None = None) -> TrainingRun:
    return TrainingRun(dataset_id=dataset_id, algorithm="dpals", config={}, requested_epsilon=1.0, delta=1e-6,
                       status=status, idempotency_key=key)


def test_the_store_of_each_dialect_keeps_the_runs_contract(db_url: str) -> None:
    ds_id = create_dataset(db_url, "default")
    with session_scope(db_url) as s:
        store = runs_store(s)
        assert isinstance(store, PostgresRunsStore if db_url.startswith("postgresql") else SqliteRunsStore)
        runs = [_run(ds_id, "queued", "k1"), _run(ds_id, "running"), _run(ds_id, "queued"), _run(ds_id, "succeeded")]
        s.add_all(runs)
        s.add_all([Item(dataset_id=ds_id, external_id=f"i{k}") for k in range(3)])
        s.flush()
        ids = [r.id for r in runs]
    with session_scope(db_url) as s:
        store = runs_store(s)
        assert store.dataset_names() == ["default"] and store.catalogue_size(ds_id) == 3
        assert store.queued_runs() == [(ids[0], None), (ids[2], None)] and store.oldest_queued_run() == ids[0]
        assert store.running_run_ids() == [ids[1]] and store.runs_in_flight(ds_id) == 3
        assert store.run_by_idempotency_key(ds_id, "k1").id == ids[0]
        assert store.run_by_idempotency_key(ds_id, "k2") is None
        page, total = store.runs_page(ds_id, 1, 2)
        assert [r.id for r in page] == [ids[2], ids[1]] and total == 4
        store.mark_enqueued(ids[0])
        assert not store.set_progress(ids[0], 0.5, "training")  # only a running run moves
        assert store.set_progress(ids[1], 0.5, "training") and store.set_heartbeat(ids[1])
        assert not store.set_heartbeat(ids[3])  # a finished (or cancelled) run: the worker stops
        assert not store.mark_private_data_read(ids[2])  # only a running run passes the point of no refund
        assert store.mark_private_data_read(ids[1])
        store.set_ratings_version(ids[1], 7)
    with session_scope(db_url) as s:
        store = runs_store(s)
        queued, running = store.lock_run(ids[0]), store.lock_run(ids[1])
        assert queued is not None and queued.enqueued_at is not None and queued.progress == 0.0
        assert not store.lock_run(ids[2]).private_data_read
        assert running is not None and running.private_data_read and running.stage == "reading data"
        assert running.ratings_version == 7 and running.heartbeat_at is not None
        assert store.lock_run(10**9) is None
        assert store.active_version(ds_id) is None and store.max_version(ds_id) == 0
        assert store.versions_page(ds_id, 0, 10) == ([], 0)
