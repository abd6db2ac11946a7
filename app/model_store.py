"""Published model versions: artifact files + ``model_versions`` rows; activation; a read cache.

Publishing (``publish_version``) inserts the immutable version row and swaps the data set's
active version in the caller's transaction. ``get_active_model`` looks up the active row on
every call (one indexed query) and loads the artifact once per (version id, sha256), so API
processes pick up a newly activated version without a restart.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.core.algorithms import get_algorithm
from app.core.mf.artifact import ArtifactError
from app.core.mf.dpfw import FrankWolfeModel
from app.core.mf.model import PublicModel
from app.db.models import Dataset, ModelVersion, TrainingRun
from app.db.stores import catalogue_store
from app.db.stores.runs import runs_store
from app.errors import (
    ArtifactMissing,
    ArtifactUnreadable,
    NoActiveModel,
    UnknownModelVersion,
)
from app.ledger import lock_account
from app.schemas.common import require_valid_page

__all__ = [
    "artifact_path_for",
    "load_version_model",
    "get_active_model",
    "get_active_version",
    "get_version",
    "list_versions",
    "publish_version",
    "activate_version",
    "clear_cache",
]

log = logging.getLogger(__name__)
_CACHE_SIZE = 4
_cache: OrderedDict[tuple[int, str], PublicModel] = OrderedDict()
_cache_lock = threading.Lock()


def artifact_path_for(dataset: str, run_id: int, artifact_dir: Path) -> Path:
    """Where run ``run_id`` of ``dataset`` writes its artifact (absolute path)."""
    base = Path(artifact_dir).expanduser().resolve()
    return base / dataset / f"run-{run_id}.npz"


_loading: dict[tuple[int, str], threading.Lock] = {}  # one loader per version: the others wait for it


def clear_cache() -> None:
    """Forget every loaded model (tests)."""
    with _cache_lock:
        _cache.clear()


def _cached(key: tuple[int, str]) -> PublicModel | None:
    with _cache_lock:
        model = _cache.get(key)
        if model is not None:
            _cache.move_to_end(key)
        return model


def load_version_model(row: ModelVersion) -> PublicModel | FrankWolfeModel:
    """The public model of a version row (by its algorithm); loaded and hash-checked once, then cached.

    Single flight: the concurrent first requests of a cold process wait for one load of a version
    instead of each reading, hashing and parsing the artifact at once."""
    key = (row.id, row.sha256)
    model = _cached(key)
    if model is not None:
        return model
    with _cache_lock:
        loading = _loading.setdefault(key, threading.Lock())
    with loading:
        model = _cached(key)
        if model is not None:
            return model
        try:
            model = get_algorithm(row.algorithm).load(row.artifact_path, row.sha256)
        except ArtifactError as exc:
            raise ArtifactUnreadable(f"artifact of model version {row.id} is unreadable or altered: {exc}") from exc
        with _cache_lock:
            _cache[key] = model
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
            _loading.pop(key, None)
    return model


def get_active_version(session: Session, dataset: str) -> ModelVersion:
    """The active version row of ``dataset`` (NoActiveModel when none is published)."""
    row = runs_store(session).active_version_by_name(dataset)
    if row is None:
        catalogue_store(session).get_dataset(dataset)  # UnknownDataset
        raise NoActiveModel(f"data set {dataset!r} has no active model yet; start a training first")
    return row


def get_active_model(session: Session, dataset: str) -> tuple[ModelVersion, PublicModel | FrankWolfeModel]:
    """(active version row, its public model) of ``dataset``."""
    row = get_active_version(session, dataset)
    return row, load_version_model(row)


def get_version(session: Session, dataset: str, version_id: int) -> ModelVersion:
    """Version ``version_id`` of ``dataset`` (UnknownModelVersion otherwise)."""
    row = runs_store(session).version_by_id(dataset, version_id)
    if row is None:
        catalogue_store(session).get_dataset(dataset)  # UnknownDataset
        raise UnknownModelVersion(f"data set {dataset!r} has no model version {version_id}", version_id=version_id)
    return row


def list_versions(session: Session, dataset: str, *, offset: int = 0, limit: int = 100) -> tuple[list[ModelVersion], int]:
    """One page of versions (newest first) and the total count."""
    require_valid_page(offset, limit)
    ds = catalogue_store(session).get_dataset(dataset)
    return runs_store(session).versions_page(ds.id, offset, limit)


def publish_version(
    session: Session,
    *,
    dataset: Dataset,
    run: TrainingRun,
    model: PublicModel,
    artifact_path: str,
    sha256: str,
    epsilon: float,
    epsilon_pld: float | None,
    delta: float,
    metrics: dict[str, Any],
) -> ModelVersion:
    """Insert the immutable version row and make it the active one. Does not commit."""
    row = ModelVersion(
        dataset_id=dataset.id,
        run_id=run.id,
        version=runs_store(session).max_version(dataset.id) + 1,
        algorithm=model.algorithm,
        artifact_path=str(artifact_path),
        sha256=sha256,
        epsilon=float(epsilon),
        epsilon_pld=None if epsilon_pld is None else float(epsilon_pld),
        delta=float(delta),
        n_items=model.n_items,
        rank=model.rank,
        metrics=metrics,
        model_metadata=dict(model.metadata),
        active=False,
    )
    session.add(row)
    session.flush()
    if dataset.model_pinned:  # an admin's rollback sticks: the new version waits, inactive
        log.info("model version %s of data set %r published inactive: the active version is pinned",
                 row.id, dataset.name)
    else:
        runs_store(session).swap_active_version(dataset.id, row)
    return row


def activate_version(session: Session, dataset: str, version_id: int, *, actor: str) -> ModelVersion:
    """Make an existing version the active one and pin it (a rollback that sticks: later
    publications stay inactive until :func:`unpin`). Does not commit."""
    row = get_version(session, dataset, version_id)
    if not Path(row.artifact_path).is_file():
        raise ArtifactMissing(f"artifact of model version {version_id} is missing; it cannot be activated")
    # The budget account lock also guards publishing, so activations and publications serialise.
    lock_account(session, row.dataset_id)
    if not row.active:
        runs_store(session).swap_active_version(row.dataset_id, row)
    catalogue_store(session).get_dataset(dataset).model_pinned = True
    log.info("model version %s of data set %r activated and pinned by %s", row.id, dataset, actor)
    return row


def unpin(session: Session, dataset: str, *, actor: str) -> ModelVersion:
    """Unpin the data set's active version and activate its newest one (publications activate
    again). Idempotent. ``NoActiveModel`` when nothing is published. Does not commit."""
    ds = catalogue_store(session).get_dataset(dataset)
    lock_account(session, ds.id)
    newest = runs_store(session).newest_version(ds.id)
    if newest is None:
        raise NoActiveModel(f"data set {dataset!r} has no published model version to activate")
    if not Path(newest.artifact_path).is_file():
        raise ArtifactMissing(f"artifact of model version {newest.id} is missing; it cannot be activated")
    ds.model_pinned = False
    if not newest.active:
        runs_store(session).swap_active_version(ds.id, newest)
    log.info("model versions of data set %r unpinned by %s; version %s active", dataset, actor, newest.id)
    return newest
