"""The ``scale`` suite (issue 28) at its small quick size on real Dask ``LocalCluster`` s: the rows'
structure, and the distributed driver's model, trained from a Parquet snapshot read on the workers,
equal to the in-process one bit for bit; the partitions read on the workers from Parquet and by COPY
from PostgreSQL, every rating delivered; the database exported as a snapshot trains the database's
model (the CI check of the suite; its quick form is
``python -m benchmarks scale --quick``). Needs the optional ``dask`` extra; skipped without it."""

from __future__ import annotations

import pytest

from benchmarks import harness
from benchmarks import scale as S
from tests.integration.conftest import PG_ADMIN_DSN

IN_PROCESS = ("in-process", "in-process-1thread")
COMMON = {"seconds_per_step", "seconds_preprocessing_and_first_step", "seconds_driver_item_step",
          "peak_rss_mib_driver", "equal_to_in_process"}
CLUSTER = {"rss_mib_worker_idle", "ratings_largest_partition", "worker_peak_over_target", "seconds_worker_tasks",
           "seconds_worker_user_solves", "seconds_worker_item_statistics", "seconds_worker_item_solves", "seconds_reduce",
           "bytes_driver_cluster_per_step", "bytes_worker_worker_per_step", "bytes_per_step", "tasks_per_step",
           "seconds_write_snapshot", "bytes_snapshot", "seconds_read_partitions", "bytes_driver_cluster_total"}
READ = {"seconds_read_partitions", "seconds_export", "bytes_source", "bytes_to_workers", "peak_rss_mib_worker_max",
        "rss_mib_worker_idle", "ratings_read"}


def test_the_suite_is_registered():
    assert harness.load_suite("scale") is S
    assert S.QUICK_SIZES[-1][2] <= 10**6 and S.QUICK_WORKERS == (1, 2)
    assert [shape[2] for shape in S.FULL_SIZES] == [10**7, 3 * 10**7, 10**8] and S.FULL_WORKERS == (1, 2, 4)


@pytest.mark.timeout(300)
def test_the_quick_size_rows_and_the_distributed_model_equal_to_the_in_process_one():
    pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")
    shape = S.QUICK_SIZES[0]
    rows = S.measure([shape], S.QUICK_WORKERS, reads=False)
    assert all(row == harness.validate_row(row) and row["suite"] == "scale" for row in rows)
    assert {row["dataset"] for row in rows} == {S.dataset_name(*shape)}
    metrics: dict[str, dict[str, float]] = {}
    for row in rows:
        metrics.setdefault(row["algorithm"], {})[row["metric"]] = row["value"]
    assert list(metrics) == [*IN_PROCESS, *(f"dask-{n}w" for n in S.QUICK_WORKERS)]
    for name in IN_PROCESS:
        assert set(metrics[name]) == COMMON
    for n in S.QUICK_WORKERS:
        got = metrics[f"dask-{n}w"]
        assert set(got) == COMMON | CLUSTER | {f"peak_rss_mib_worker{i}" for i in range(n)}
        assert all(got[f"peak_rss_mib_worker{i}"] >= got["rss_mib_worker_idle"] > 0 for i in range(n))
        assert got["tasks_per_step"] > 0 and got["bytes_driver_cluster_per_step"] > 0
        assert got["bytes_per_step"] == got["bytes_driver_cluster_per_step"] + got["bytes_worker_worker_per_step"]
        assert 0 < got["ratings_largest_partition"] <= shape[2]
        assert 0 < got["seconds_read_partitions"] < got["seconds_preprocessing_and_first_step"]
        assert got["bytes_snapshot"] > 0 and got["seconds_write_snapshot"] > 0
    assert metrics["dask-1w"]["bytes_worker_worker_per_step"] == 0  # one worker: nothing crosses between workers
    assert metrics["dask-2w"]["bytes_worker_worker_per_step"] > 0  # a partial statistic reaches the reducer
    assert all(values["equal_to_in_process"] == 1.0 for values in metrics.values())
    assert all(values["seconds_per_step"] > 0 for values in metrics.values())


@pytest.mark.timeout(300)
def test_the_partitions_read_from_parquet_and_by_copy(pg_template: str):
    """Two workers read every rating from each source (PostgreSQL: the service's partitioned read
    in an exported snapshot, loaded through its batch ingest)."""
    pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")
    shape = S.QUICK_SIZES[0]
    ratings = S.production_synthetic(*shape, seed=0).ratings
    rows = S.read_rows(S.dataset_name(*shape), ratings, (2,), PG_ADMIN_DSN)
    assert all(row == harness.validate_row(row) for row in rows)
    metrics: dict[str, dict[str, float]] = {}
    for row in rows:
        metrics.setdefault(row["algorithm"], {})[row["metric"]] = row["value"]
    assert list(metrics) == ["read-parquet-2w", "read-copy-2w"]
    for got in metrics.values():
        assert set(got) == READ and got["ratings_read"] == ratings.nnz
        assert got["seconds_read_partitions"] > 0 and got["peak_rss_mib_worker_max"] >= got["rss_mib_worker_idle"] > 0
        assert got["bytes_source"] > 0 and got["bytes_to_workers"] > 0
    assert metrics["read-copy-2w"]["bytes_to_workers"] == 43 * ratings.nnz + 2 * 21


@pytest.mark.timeout(300)
def test_an_export_of_the_database_trains_the_database_model(pg_template: str, tmp_path):
    """The export step: the service's partitioned COPY read written as a Parquet snapshot, partition by
    partition; trained from it, the model is the one trained from the database read in one process,
    bit for bit (the users are the database's: their ids key the sampling)."""
    pytest.importorskip("pyarrow", reason="the optional 'dask' extra is not installed")
    from app.core.data.partitioned import gather
    from app.core.data.snapshot import open_snapshot, write_snapshot
    from app.core.mf.dpals import train_dpals

    ratings = S.production_synthetic(*S.QUICK_SIZES[0], seed=0).ratings
    with S.postgres_with(ratings, PG_ADMIN_DSN) as (url, _, _), S.postgres_partitions(url, 3) as data:
        write_snapshot(tmp_path / "export", (reader() for reader in data.readers), data.item_ids)
        database = gather(data)
    exported = open_snapshot(tmp_path / "export")
    assert exported.item_ids.tolist() == S.synthetic_ids(ratings)[1] and database.nnz == ratings.nnz
    assert S.same_model(train_dpals(exported, S.config()), train_dpals(database, S.config()))
