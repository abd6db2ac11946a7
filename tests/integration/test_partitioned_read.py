"""A cluster run's data read by partition, on PostgreSQL (issue 28, item 2).

The driver exports one snapshot and reads only public inputs; each :class:`PostgresPartition`
reader ``COPY``-s out its users' rows in that snapshot. Checked against the in-process loaders on
the same database: per user, per (user, period) and for DP-CMF (public users left out of every
partition, their rows a public source), with and without a run's blocks; rows written after the
export are in no partition; the model trained from the partitions is the in-process model.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import insert, select, text

from app.core.algorithms import get_algorithm
from app.core.data.partitioned import PartitionedRatings, gather
from app.core.mf.distributed import InProcess, distributed_fit
from app.core.mf.dpals import DPALSConfig, train_dpals
from app.db import loaders
from app.db.models import Item, PublicRatingConsent, Rating, User
from app.db.partitions import PostgresPartition, exported_snapshot, partitioned_inputs
from app.db.session import session_scope
from app.db.stores import blocks as block_store
from app.db.stores.ratings import UserPartition, partition_filter
from app.services import budget
from tests.integration.platform_helpers import create_dataset

pytestmark = pytest.mark.integration

DELTA = 1e-6
DAY0 = datetime(2031, 1, 1, 12, tzinfo=UTC)
N_ITEMS = 12


def _day(k: int) -> datetime:
    return DAY0 + timedelta(days=k)


def _seed(url: str, *, unit: str = "user") -> None:
    """A daily calendar from DAY0; 3 days of users (12 a day) rating some of 12 items, each on
    her creation day and the next; two users whose ratings are public."""
    if unit == "user":
        create_dataset(url, cap=10.0, delta=DELTA)
    with session_scope(url) as s:
        block_store.ensure_calendar(s, "day", DAY0)
    if unit == "user_period":
        with session_scope(url) as s:
            budget.put_person_budget(s, name="units", epsilon_cap=10.0, delta=DELTA, relation=None, reason="t",
                                     actor="t", privacy_unit="user_period")
        with session_scope(url) as s:
            budget.ensure_dataset(s, "default", rating_min=1.0, rating_max=5.0, epsilon_cap=10.0, delta=DELTA,
                                  person_budget="units", privacy_unit="user_period")
    rng = np.random.default_rng(7)
    with session_scope(url) as s:
        ds = budget.get_dataset(s, "default")
        s.execute(insert(Item), [{"dataset_id": ds.id, "external_id": f"i{j}", "categories": [], "features": {}}
                                 for j in range(N_ITEMS)])
        items = s.scalars(select(Item.id).where(Item.dataset_id == ds.id).order_by(Item.id)).all()
        for day in range(3):
            s.execute(insert(User), [{"external_id": f"d{day}u{k}", "created_at": _day(day), "updated_at": _day(day)}
                                     for k in range(12)])
            users = s.scalars(select(User.id).where(User.external_id.like(f"d{day}u%"))).all()
            rows = []
            for u in users:
                for j in rng.choice(len(items), size=int(rng.integers(2, 9)), replace=False).tolist():
                    at = _day(day + j % 2)
                    rows.append({"dataset_id": ds.id, "user_id": u, "item_id": items[j],
                                 "value": float(rng.integers(1, 6)), "created_at": at, "updated_at": at})
            s.execute(insert(Rating), rows)
        public = s.scalars(select(User.id).where(User.external_id.in_(["d0u1", "d2u3"]))).all()
        s.add_all([PublicRatingConsent(dataset_id=ds.id, user_id=u, public=True) for u in public])


def _in_process(url: str, algorithm: str, cohorts):
    with session_scope(url) as s:
        return loaders.load_training_inputs(s, budget.get_dataset(s, "default"), get_algorithm(algorithm),
                                            cohorts=cohorts)


def _partitioned(url: str, algorithm: str, cohorts, n: int, between=None):
    """(the partitions gathered while the snapshot is held, the public inputs); ``between`` runs
    after the export and before the workers' reads."""
    labels = None if cohorts is None else tuple(cohorts)
    with exported_snapshot(url, labels) as snapshot:
        ds = budget.get_dataset(snapshot.session, "default")
        data, extra = partitioned_inputs(snapshot, url, ds, get_algorithm(algorithm), n, labels)
        if between is not None:
            between()
        return data, gather(data), extra


def _rows(ratings) -> dict[str, dict[int, float]]:
    out = {}
    for r, label in enumerate(ratings.user_ids.tolist()):
        cols, vals = ratings.user_row(r)
        out[str(label)] = dict(zip(cols.tolist(), vals.tolist(), strict=True))
    return out


def _same_public(got, want) -> None:
    got_sources = {s.name: s for s in got.get("public", type("E", (), {"sources": ()})()).sources}
    want_sources = {s.name: s for s in want.get("public", type("E", (), {"sources": ()})()).sources}
    assert sorted(got_sources) == sorted(want_sources)
    for name, source in want_sources.items():
        assert got_sources[name].row_labels == source.row_labels
        assert (got_sources[name].matrix != source.matrix).nnz == 0


@pytest.mark.parametrize("algorithm", ["dpals", "dpcmf"])
@pytest.mark.parametrize(("unit", "with_blocks"), [("user", True), ("user", False), ("user_period", True)])
def test_the_partitions_hold_what_the_in_process_read_holds(pg_url, unit: str, algorithm: str, with_blocks: bool):
    _seed(pg_url, unit=unit)
    cohorts = ["2031-01-01", "2031-01-03"] if with_blocks else None  # days 0 and 2: a run's blocks
    want, want_extra = _in_process(pg_url, algorithm, cohorts)
    for n in (1, 3, 4):
        data, got, extra = _partitioned(pg_url, algorithm, cohorts, n)
        assert data.n_partitions == n and np.array_equal(data.item_ids, want.item_ids)
        assert _rows(got) == _rows(want)
        _same_public(extra, want_extra)
    labels = set(_rows(want))
    assert len(labels) >= 20 and (not with_blocks or len(labels) < 36 * (2 if unit == "user_period" else 1))
    if algorithm == "dpcmf":
        assert len(data.excluded_labels) == 2 and not {label.split("@")[0] for label in labels} & data.excluded_labels
        assert extra["public"].get("public_users").n_rows == 2


def test_rows_written_after_the_export_are_in_no_partition(pg_url):
    _seed(pg_url)
    want, _ = _in_process(pg_url, "dpals", None)

    def write_meanwhile() -> None:
        with session_scope(pg_url) as s:
            ds = budget.get_dataset(s, "default")
            late = s.scalar(insert(User).values(external_id="late", created_at=_day(1), updated_at=_day(1))
                            .returning(User.id))
            first_item = s.scalar(select(Item.id).where(Item.dataset_id == ds.id).order_by(Item.id))
            s.execute(insert(Rating), [{"dataset_id": ds.id, "user_id": late, "item_id": first_item, "value": 5.0}])

    _, got, _ = _partitioned(pg_url, "dpals", None, 3, between=write_meanwhile)
    assert _rows(got) == _rows(want)
    after, _ = _in_process(pg_url, "dpals", None)
    assert len(_rows(after)) == len(_rows(want)) + 1  # the write landed; the snapshot did not see it


def test_a_model_trained_from_the_partitions_is_the_in_process_model(pg_url):
    _seed(pg_url)
    config = DPALSConfig(rank=3, n_steps=2, contribution_bound=6, noise_multiplier=0.8, seed=(1 << 90) + 5)
    want = train_dpals(_in_process(pg_url, "dpals", None)[0], config)
    with exported_snapshot(pg_url, None) as snapshot:
        ds = budget.get_dataset(snapshot.session, "default")
        data, _ = partitioned_inputs(snapshot, pg_url, ds, get_algorithm("dpals"), 3, None)
        got = train_dpals(data, config, fit=distributed_fit(InProcess()))
        also = train_dpals(data, config)  # the in-process trainer reads every partition itself
    for model in (got, also):
        for name in ("item_factors", "item_biases", "item_counts", "trained_mask"):
            np.testing.assert_array_equal(getattr(model, name), getattr(want, name))
        assert model.global_mean == want.global_mean and model.event == want.event


def test_a_reader_never_shows_its_url_and_checks_its_snapshot_id(pg_url):
    reader = PostgresPartition(pg_url, "00000003-0000001B-1", 1, None, UserPartition(0, 2))
    assert "range" in repr(reader)
    assert pg_url not in repr(reader) and "postgres" not in repr(reader)
    with pytest.raises(ValueError, match="snapshot"):
        PostgresPartition(pg_url, "1'; DROP TABLE ratings; --", 1, None, UserPartition(0, 2))
    with pytest.raises(ValueError, match="range"):
        partition_filter(UserPartition(3, 2))


def test_a_snapshot_the_database_dropped_after_the_reads_closes_quietly(pg_url):
    """An outage after the partitions were read ends the held transaction: the run goes on."""
    _seed(pg_url)
    want, _ = _in_process(pg_url, "dpals", None)
    with exported_snapshot(pg_url, None) as snapshot:
        ds = budget.get_dataset(snapshot.session, "default")
        data, _ = partitioned_inputs(snapshot, pg_url, ds, get_algorithm("dpals"), 2, None)
        got = gather(data)
        pid = snapshot.session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with session_scope(pg_url) as s:
            assert s.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
    assert _rows(got) == _rows(want)


def test_partitioned_reads_refuse_sqlite(sqlite_url):
    with pytest.raises(RuntimeError, match="PostgreSQL"), exported_snapshot(sqlite_url, None):
        pass


def test_a_partitioned_matrix_needs_a_partition():
    with pytest.raises(ValueError):
        PartitionedRatings(np.arange(3), ())
