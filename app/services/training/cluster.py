"""Training on a Dask cluster when ``DASK_SCHEDULER_ADDRESS`` is set (issue 28).

The Celery task stays the run's driver: it claims the run, checks public facts, commits
``private_data_read`` and publishes through the outbox exactly as in process
(:mod:`app.services.training.runner`). It does not read the private ratings: it exports a snapshot
of the database and hands the cluster one reader per user partition (:func:`partitioned_read`,
:mod:`app.db.partitions`), which the workers run. The private part of DPALS / DP-CMF runs on the
cluster, through :func:`app.core.mf.distributed.distributed_fit`: the per-partition statistics
on the workers, every release on this process. Other algorithms train in process.

The cluster is connected to *before* the private read, so an unreachable scheduler, a missing
``dask`` extra or an SQLite database fails the run refunded; a worker lost afterwards either heals
(Dask recomputes pure tasks) or fails the run closed: charged, nothing published. With the TLS
files configured the client uses Dask's ``Security`` (TLS, mutual authentication, encryption
required). ``distributed`` is imported here only, lazily: the default install and the CLI never load
it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from app.config import Settings
from app.core.algorithms import Algorithm
from app.core.data.partitioned import PartitionedRatings
from app.core.data.ratings import Ratings
from app.core.mf.distributed import DaskExecutor, distributed_fit
from app.db.partitions import exported_snapshot, partitioned_inputs
from app.db.session import is_sqlite_url
from app.services.budget import get_dataset

__all__ = ["uses_cluster", "cluster_client", "train_on_cluster", "check_cluster_database", "partitioned_read",
           "partition_count"]

log = logging.getLogger(__name__)


def uses_cluster(settings: Settings, algorithm: Algorithm[Any, Any]) -> bool:
    """Whether a run of ``algorithm`` trains on the Dask cluster under ``settings``."""
    return settings.dask_scheduler_address is not None and algorithm.distributable


def check_cluster_database(url: str) -> None:
    """Cluster mode refuses the embedded SQLite database (a public fact: checked before the charge)."""
    if is_sqlite_url(url):
        raise RuntimeError("cluster training (DASK_SCHEDULER_ADDRESS) needs PostgreSQL; "
                           "it refuses the embedded SQLite database")


def _security(settings: Settings) -> Any:
    """Dask's ``Security`` from the configured PEM files (TLS, mutual authentication), or None."""
    if not settings.dask_tls:
        return None
    from distributed import Security

    return Security(tls_ca_file=str(settings.dask_tls_ca_file), tls_client_cert=str(settings.dask_tls_cert_file),
                    tls_client_key=str(settings.dask_tls_key_file), require_encryption=True)


@contextmanager
def cluster_client(settings: Settings) -> Iterator[Any]:
    """A ``distributed.Client`` connected to ``DASK_SCHEDULER_ADDRESS`` for one run, closed after it
    (its futures, and so the run's partitions on the workers, released)."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise RuntimeError("DASK_SCHEDULER_ADDRESS is set but the optional 'dask' extra is not installed "
                           "(pip install 'privrec[dask]')") from exc
    client = Client(settings.dask_scheduler_address, security=_security(settings), set_as_default=False,
                    timeout=settings.dask_connect_timeout_s)
    try:
        yield client
    finally:
        client.close()


def partition_count(settings: Settings, client: Any) -> int:
    """The run's user partitions: ``DASK_PARTITIONS``, else one per worker thread (public facts)."""
    return settings.dask_partitions or max(1, sum(client.nthreads().values()))


@contextmanager
def partitioned_read(client: Any, settings: Settings, url: str, dataset: str, algorithm: Algorithm[Any, Any],
                     cohorts: Sequence[str] | None,
                     on_version: Callable[[int], None]) -> Iterator[tuple[PartitionedRatings, dict[str, Any]]]:
    """The run's training data as partition readers in one exported snapshot of the database (held
    for the block: a task the cluster recomputes reads the same rows), and ``train``'s extra inputs;
    ``on_version`` gets the data set's version in that snapshot. The private rows are read by the
    workers only (:mod:`app.db.partitions`)."""
    labels = None if cohorts is None else tuple(cohorts)
    with exported_snapshot(url, labels) as snapshot:
        ds = get_dataset(snapshot.session, dataset)
        data, extra = partitioned_inputs(snapshot, url, ds, algorithm, partition_count(settings, client), labels)
        on_version(ds.ratings_version)
        yield data, extra


def train_on_cluster(client: Any, algorithm: Algorithm[Any, Any], ratings: Ratings | PartitionedRatings, config: Any,
                     settings: Settings, *, progress: Any = None, **inputs: Any) -> Any:
    """The published model of one run of a distributable ``algorithm`` trained on ``client``'s
    cluster: ``ratings`` read on the workers (a :class:`PartitionedRatings`, the service's path) or
    cut here into :func:`partition_count` partitions; logs only public counts (partitions, tasks),
    never sizes that follow the data."""
    n_partitions = ratings.n_partitions if isinstance(ratings, PartitionedRatings) else partition_count(settings, client)
    executor = DaskExecutor(client, timeout_s=settings.dask_result_timeout_s)
    data: Any = ratings  # a distributable algorithm's train takes partitions too (Algorithm.distributable)
    model = algorithm.train(data, config, progress=progress, fit=distributed_fit(executor, n_partitions=n_partitions),
                            **inputs)
    log.info("cluster training: %d partitions, %d tasks", n_partitions, executor.tasks)
    return model
