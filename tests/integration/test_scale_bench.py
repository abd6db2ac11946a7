"""The ``scale`` suite (issue 28) at its small quick size on real Dask ``LocalCluster`` s: the rows'
structure, and the distributed driver's model equal to the in-process one bit for bit (the CI check
of the suite; its quick form is ``python -m benchmarks scale --quick``). Needs the optional
``dask`` extra; skipped without it."""

from __future__ import annotations

import pytest

from benchmarks import harness
from benchmarks import scale as S

IN_PROCESS = ("in-process", "in-process-1thread")
COMMON = {"seconds_per_step", "seconds_preprocessing_and_first_step", "seconds_driver_item_step",
          "peak_rss_mib_driver", "equal_to_in_process"}
CLUSTER = {"rss_mib_worker_idle", "ratings_largest_partition", "worker_peak_over_target", "seconds_worker_tasks",
           "seconds_worker_user_solves", "seconds_worker_item_statistics", "seconds_reduce",
           "bytes_driver_cluster_per_step", "bytes_worker_worker_per_step", "bytes_per_step", "tasks_per_step"}


def test_the_suite_is_registered():
    assert harness.load_suite("scale") is S
    assert S.QUICK_SIZES[-1][2] <= 10**6 and S.QUICK_WORKERS == (1, 2)
    assert [shape[2] for shape in S.FULL_SIZES] == [10**7, 3 * 10**7, 10**8] and S.FULL_WORKERS == (1, 2, 4)


@pytest.mark.timeout(300)
def test_the_quick_size_rows_and_the_distributed_model_equal_to_the_in_process_one():
    pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")
    shape = S.QUICK_SIZES[0]
    rows = S.measure([shape], S.QUICK_WORKERS)
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
    assert metrics["dask-1w"]["bytes_worker_worker_per_step"] == 0  # one worker: nothing crosses between workers
    assert metrics["dask-2w"]["bytes_worker_worker_per_step"] > 0  # a partial statistic reaches the reducer
    assert all(values["equal_to_in_process"] == 1.0 for values in metrics.values())
    assert all(values["seconds_per_step"] > 0 for values in metrics.values())
