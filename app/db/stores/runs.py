"""Training runs and published model versions: every query the training use cases and the
model store make (PostgreSQL and SQLite).

The run table is also the dispatch outbox (``enqueued_at``) and the heartbeat board of running
workers. :func:`runs_store` picks the implementation from the session's dialect once: PostgreSQL
row-locks a run it changes (``FOR UPDATE``); SQLite serialises writers and takes no row lock.
Nothing here commits: the caller's transaction does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from app.db.models import Dataset, Item, ModelVersion, TrainingRun, utcnow
from app.db.session import store_for

__all__ = ["PostgresRunsStore", "RunsStore", "SqliteRunsStore", "runs_store"]


class RunsStore:
    """Training runs, model versions and the public data set facts training reads, in one
    session (the interface; :func:`runs_store` gives the dialect's implementation)."""

    row_locks: ClassVar[bool] = False

    def __init__(self, session: Session) -> None:
        self.session = session

    # ------------------------------------------------------------------------- runs
    def lock_run(self, run_id: int) -> TrainingRun | None:
        """Run ``run_id`` read afresh, row-locked until the transaction ends (None when absent)."""
        stmt = select(TrainingRun).where(TrainingRun.id == run_id)
        if self.row_locks:
            stmt = stmt.with_for_update()
        return self.session.execute(stmt.execution_options(populate_existing=True)).scalar_one_or_none()

    def run_by_idempotency_key(self, dataset_id: int, key: str) -> TrainingRun | None:
        """The run of data set ``dataset_id`` requested with ``key`` before, if any."""
        return self.session.scalar(select(TrainingRun).where(TrainingRun.dataset_id == dataset_id,
                                                             TrainingRun.idempotency_key == key))

    def runs_page(self, dataset_id: int, offset: int, limit: int) -> tuple[list[TrainingRun], int]:
        """One page of the data set's runs (newest first) and their total count."""
        where = TrainingRun.dataset_id == dataset_id
        total = self.session.scalar(select(func.count()).select_from(TrainingRun).where(where)) or 0
        page = select(TrainingRun).where(where).order_by(TrainingRun.id.desc()).offset(offset).limit(limit)
        return list(self.session.scalars(page)), int(total)

    def runs_in_flight(self, dataset_id: int) -> int:
        """How many of the data set's runs are queued or running."""
        return int(self.session.scalar(select(func.count()).select_from(TrainingRun).where(
            TrainingRun.dataset_id == dataset_id, TrainingRun.status.in_(("queued", "running")))) or 0)

    def last_scheduled_at(self, dataset_id: int) -> datetime | None:
        """When the data set's latest scheduled run was created (None: never)."""
        return self.session.scalar(select(func.max(TrainingRun.created_at)).where(
            TrainingRun.dataset_id == dataset_id, TrainingRun.trigger == "schedule"))

    def running_run_ids(self) -> list[int]:
        """Every run marked running (a worker holds it, or held it before vanishing)."""
        return list(self.session.scalars(select(TrainingRun.id).where(TrainingRun.status == "running")))

    def queued_runs(self) -> list[tuple[int, datetime | None]]:
        """(id, enqueued_at) of every queued run, oldest first: the outbox."""
        rows = self.session.execute(select(TrainingRun.id, TrainingRun.enqueued_at)
                                    .where(TrainingRun.status == "queued").order_by(TrainingRun.id))
        return [(int(run_id), sent) for run_id, sent in rows]

    def oldest_queued_run(self) -> int | None:
        """The id of the oldest queued run (the embedded worker's next), if any."""
        return self.session.scalar(select(TrainingRun.id).where(TrainingRun.status == "queued")
                                   .order_by(TrainingRun.id).limit(1))

    def mark_enqueued(self, run_id: int) -> None:
        """The run's message is with the broker (or the embedded worker was woken)."""
        self._set(run_id, enqueued_at=utcnow())

    def set_heartbeat(self, run_id: int) -> bool:
        """The worker holding running run ``run_id`` is alive; False when the run is no longer
        running (cancelled, or failed by the reaper): the worker stops."""
        return self._set_running(run_id, heartbeat_at=utcnow())

    def set_progress(self, run_id: int, progress: float, stage: str) -> bool:
        """Progress and stage of running run ``run_id`` (a heartbeat too); False as for
        :meth:`set_heartbeat`."""
        return self._set_running(run_id, progress=progress, stage=stage, heartbeat_at=utcnow())

    def mark_private_data_read(self, run_id: int) -> bool:
        """The point of no refund: the run is about to read private data. Only a run still
        ``running`` passes it (False otherwise: cancelled, it must not read)."""
        return self._set_running(run_id, private_data_read=True, stage="reading data", progress=0.05,
                                 heartbeat_at=utcnow())

    def set_ratings_version(self, run_id: int, version: int) -> None:
        """The data set's ``ratings_version`` the run read."""
        self._set(run_id, ratings_version=version)

    def _set(self, run_id: int, **values: Any) -> None:
        self.session.execute(update(TrainingRun).where(TrainingRun.id == run_id).values(**values))

    def _set_running(self, run_id: int, **values: Any) -> bool:
        """Update run ``run_id`` only while it is ``running``; True when it was."""
        result = self.session.execute(update(TrainingRun)
                                      .where(TrainingRun.id == run_id, TrainingRun.status == "running")
                                      .values(**values))
        return bool(getattr(result, "rowcount", 0))

    # ------------------------------------------------------------------------- data sets (public facts)
    def dataset_names(self) -> list[str]:
        """Every data set's name, in creation order."""
        return list(self.session.scalars(select(Dataset.name).order_by(Dataset.id)))

    def catalogue_size(self, dataset_id: int) -> int:
        """The public catalogue size (every item of the data set, as training loads them)."""
        return int(self.session.scalar(select(func.count()).select_from(Item)
                                       .where(Item.dataset_id == dataset_id)) or 0)

    # ------------------------------------------------------------------------- model versions
    def active_version(self, dataset_id: int) -> ModelVersion | None:
        """The data set's active model version, if one is published."""
        return self.session.scalar(select(ModelVersion).where(ModelVersion.dataset_id == dataset_id,
                                                              ModelVersion.active.is_(True)))

    def active_version_by_name(self, dataset: str) -> ModelVersion | None:
        """The active model version of the data set called ``dataset``, if any."""
        return self.session.scalar(self._versions_of(dataset).where(ModelVersion.active.is_(True)))

    def version_by_id(self, dataset: str, version_id: int) -> ModelVersion | None:
        """Version ``version_id`` if it belongs to the data set called ``dataset``."""
        return self.session.scalar(self._versions_of(dataset).where(ModelVersion.id == version_id))

    @staticmethod
    def _versions_of(dataset: str) -> Select[ModelVersion]:
        return select(ModelVersion).join(Dataset, Dataset.id == ModelVersion.dataset_id).where(Dataset.name == dataset)

    def versions_page(self, dataset_id: int, offset: int, limit: int) -> tuple[list[ModelVersion], int]:
        """One page of the data set's versions (newest first) and their total count."""
        where = ModelVersion.dataset_id == dataset_id
        total = self.session.scalar(select(func.count()).select_from(ModelVersion).where(where)) or 0
        page = select(ModelVersion).where(where).order_by(ModelVersion.id.desc()).offset(offset).limit(limit)
        return list(self.session.scalars(page)), int(total)

    def newest_version(self, dataset_id: int) -> ModelVersion | None:
        """The data set's most recently published version, if any."""
        return self.session.scalar(select(ModelVersion).where(ModelVersion.dataset_id == dataset_id)
                                   .order_by(ModelVersion.version.desc()).limit(1))

    def max_version(self, dataset_id: int) -> int:
        """The highest version number the data set has published (0 before the first)."""
        return int(self.session.scalar(select(func.max(ModelVersion.version))
                                       .where(ModelVersion.dataset_id == dataset_id)) or 0)

    def swap_active_version(self, dataset_id: int, row: ModelVersion) -> None:
        """Make ``row`` the data set's only active version."""
        self.session.execute(
            update(ModelVersion)
            .where(ModelVersion.dataset_id == dataset_id, ModelVersion.active.is_(True), ModelVersion.id != row.id)
            .values(active=False)
            .execution_options(synchronize_session="fetch")
        )
        self.session.flush()
        row.active = True
        row.activated_at = utcnow()
        self.session.flush()


class PostgresRunsStore(RunsStore):
    """Runs on PostgreSQL: a run being changed is row-locked until the transaction ends."""

    row_locks = True


class SqliteRunsStore(RunsStore):
    """Runs on SQLite: one writer at a time, so no row lock."""


_STORES: dict[str, type[RunsStore]] = {"postgresql": PostgresRunsStore, "sqlite": SqliteRunsStore}


def runs_store(session: Session) -> RunsStore:
    """The runs store of ``session``'s database (chosen by its dialect)."""
    return store_for(session, _STORES)
