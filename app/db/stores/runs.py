"""Training runs and published model versions: every query the training use cases make.

The run table is also the dispatch outbox (``enqueued_at``) and the heartbeat board of running
workers. Row locks (``FOR UPDATE``) are taken on PostgreSQL only; SQLite serialises writers.
Nothing here commits: the caller's transaction does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from app.db.models import Dataset, Item, ModelVersion, TrainingRun, utcnow
from app.db.session import is_postgres

__all__ = [
    "active_version", "active_version_by_name", "catalogue_size", "count_versions", "dataset_by_name",
    "dataset_names", "lock_run", "mark_enqueued", "mark_private_data_read", "oldest_queued_run", "max_version", "queued_runs",
    "run_by_idempotency_key", "running_run_ids", "runs_in_flight", "runs_page", "set_heartbeat",
    "set_progress", "set_ratings_version", "swap_active_version", "version_by_id", "versions_page",
]


def _locked(session: Session, stmt: Select[Any]) -> Select[Any]:
    return stmt.with_for_update() if is_postgres(session) else stmt


# ----------------------------------------------------------------------------- runs
def lock_run(session: Session, run_id: int) -> TrainingRun | None:
    """Run ``run_id`` read afresh, row-locked until the transaction ends (None when absent)."""
    stmt = _locked(session, select(TrainingRun).where(TrainingRun.id == run_id))
    return session.execute(stmt.execution_options(populate_existing=True)).scalar_one_or_none()


def run_by_idempotency_key(session: Session, dataset_id: int, key: str) -> TrainingRun | None:
    """The run of data set ``dataset_id`` requested with ``key`` before, if any."""
    return session.scalar(select(TrainingRun).where(TrainingRun.dataset_id == dataset_id,
                                                    TrainingRun.idempotency_key == key))


def runs_page(session: Session, dataset_id: int, offset: int, limit: int) -> tuple[list[TrainingRun], int]:
    """One page of the data set's runs (newest first) and their total count."""
    where = TrainingRun.dataset_id == dataset_id
    total = session.scalar(select(func.count()).select_from(TrainingRun).where(where)) or 0
    rows = session.scalars(select(TrainingRun).where(where).order_by(TrainingRun.id.desc()).offset(offset).limit(limit))
    return list(rows), int(total)


def runs_in_flight(session: Session, dataset_id: int) -> int:
    """How many of the data set's runs are queued or running."""
    return int(session.scalar(select(func.count()).select_from(TrainingRun).where(
        TrainingRun.dataset_id == dataset_id, TrainingRun.status.in_(("queued", "running")))) or 0)


def running_run_ids(session: Session) -> list[int]:
    """Every run marked running (a worker holds it, or held it before vanishing)."""
    return list(session.scalars(select(TrainingRun.id).where(TrainingRun.status == "running")))


def queued_runs(session: Session) -> list[tuple[int, datetime | None]]:
    """(id, enqueued_at) of every queued run, oldest first: the outbox."""
    rows = session.execute(select(TrainingRun.id, TrainingRun.enqueued_at).where(TrainingRun.status == "queued")
                           .order_by(TrainingRun.id)).all()
    return [(int(run_id), sent) for run_id, sent in rows]


def oldest_queued_run(session: Session) -> int | None:
    """The id of the oldest queued run (the embedded worker's next), if any."""
    return session.scalar(select(TrainingRun.id).where(TrainingRun.status == "queued").order_by(TrainingRun.id).limit(1))


def mark_enqueued(session: Session, run_id: int) -> None:
    """The run's message is with the broker (or the embedded worker was woken)."""
    session.execute(update(TrainingRun).where(TrainingRun.id == run_id).values(enqueued_at=utcnow()))


def set_heartbeat(session: Session, run_id: int) -> None:
    """The worker holding running run ``run_id`` is alive."""
    session.execute(update(TrainingRun).where(TrainingRun.id == run_id, TrainingRun.status == "running")
                    .values(heartbeat_at=utcnow()))


def set_progress(session: Session, run_id: int, progress: float, stage: str) -> None:
    """Progress and stage of running run ``run_id`` (a heartbeat too)."""
    session.execute(update(TrainingRun).where(TrainingRun.id == run_id, TrainingRun.status == "running")
                    .values(progress=progress, stage=stage, heartbeat_at=utcnow()))


def mark_private_data_read(session: Session, run_id: int) -> None:
    """The point of no refund: the run is about to read private data."""
    session.execute(update(TrainingRun).where(TrainingRun.id == run_id)
                    .values(private_data_read=True, stage="reading data", progress=0.05, heartbeat_at=utcnow()))


def set_ratings_version(session: Session, run_id: int, version: int) -> None:
    """The data set's ``ratings_version`` the run read."""
    session.execute(update(TrainingRun).where(TrainingRun.id == run_id).values(ratings_version=version))


# ----------------------------------------------------------------------------- data sets (public facts)
def dataset_by_name(session: Session, name: str) -> Dataset | None:
    """The data set called ``name``, if any."""
    return session.scalar(select(Dataset).where(Dataset.name == name))


def dataset_names(session: Session) -> list[str]:
    """Every data set's name, in creation order."""
    return list(session.scalars(select(Dataset.name).order_by(Dataset.id)))


def catalogue_size(session: Session, dataset_id: int) -> int:
    """The public catalogue size (every item of the data set, as training loads them)."""
    return int(session.scalar(select(func.count()).select_from(Item).where(Item.dataset_id == dataset_id)) or 0)


# ----------------------------------------------------------------------------- model versions
def active_version(session: Session, dataset_id: int) -> ModelVersion | None:
    """The data set's active model version, if one is published."""
    return session.scalar(select(ModelVersion).where(ModelVersion.dataset_id == dataset_id,
                                                     ModelVersion.active.is_(True)))


def active_version_by_name(session: Session, dataset: str) -> ModelVersion | None:
    """The active model version of the data set called ``dataset``, if any."""
    return session.scalar(select(ModelVersion).join(Dataset, Dataset.id == ModelVersion.dataset_id).where(
        Dataset.name == dataset, ModelVersion.active.is_(True)))


def version_by_id(session: Session, dataset: str, version_id: int) -> ModelVersion | None:
    """Version ``version_id`` if it belongs to the data set called ``dataset``."""
    return session.scalar(select(ModelVersion).join(Dataset, Dataset.id == ModelVersion.dataset_id).where(
        Dataset.name == dataset, ModelVersion.id == version_id))


def count_versions(session: Session, dataset_id: int) -> int:
    """How many versions the data set has published."""
    return int(session.scalar(select(func.count()).select_from(ModelVersion)
                              .where(ModelVersion.dataset_id == dataset_id)) or 0)


def versions_page(session: Session, dataset_id: int, offset: int, limit: int) -> tuple[list[ModelVersion], int]:
    """One page of the data set's versions (newest first) and their total count."""
    rows = session.scalars(select(ModelVersion).where(ModelVersion.dataset_id == dataset_id)
                           .order_by(ModelVersion.id.desc()).offset(offset).limit(limit))
    return list(rows), count_versions(session, dataset_id)


def max_version(session: Session, dataset_id: int) -> int:
    """The highest version number the data set has published (0 before the first)."""
    return int(session.scalar(select(func.max(ModelVersion.version))
                              .where(ModelVersion.dataset_id == dataset_id)) or 0)


def swap_active_version(session: Session, dataset_id: int, row: ModelVersion) -> None:
    """Make ``row`` the data set's only active version."""
    session.execute(
        update(ModelVersion)
        .where(ModelVersion.dataset_id == dataset_id, ModelVersion.active.is_(True), ModelVersion.id != row.id)
        .values(active=False)
        .execution_options(synchronize_session="fetch")
    )
    session.flush()
    row.active = True
    row.activated_at = utcnow()
    session.flush()
