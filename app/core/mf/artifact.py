"""Model artifacts: one ``.npz`` of public arrays plus JSON metadata, sealed by a content hash.

The ``.npz`` holds only public arrays (item ids, item factors, trained mask, DP counts) and is
read with ``allow_pickle=False``; item ids are stored as unicode strings or integers, never as
objects. The JSON file (``<name>.json`` beside it) holds the DP mean, the user-solve ridge, the
config, the metadata and the run's ``DpEvent``; its ``sha256`` field covers the ``.npz`` bytes and
the rest of the JSON, so any change to either is detected on load.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.core.mf.model import PublicModel, UserRegularisation
from app.core.privacy import accounting

__all__ = [
    "ArtifactInfo", "save_model", "load_model", "ArtifactError", "FORMAT_VERSION",
    "_digest", "storable_ids", "_write_atomically",
]

FORMAT_VERSION = 2  # 2 adds item_biases; version 1 artifacts load with zero biases
_ARRAYS_V1 = ("item_ids", "item_factors", "trained_mask", "item_counts")
_ARRAYS = (*_ARRAYS_V1, "item_biases")


class ArtifactError(ValueError):
    """The artifact is missing, malformed or fails its hash check."""


@dataclass(frozen=True)
class ArtifactInfo:
    npz_path: Path
    json_path: Path
    sha256: str
    metadata: dict[str, Any]


def storable_ids(ids: np.ndarray) -> np.ndarray:
    """Item ids as int64 or unicode strings: never an object array (no pickles)."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return ids.astype(np.int64)
    if ids.dtype.kind in "OUS":
        return np.asarray([str(x) for x in ids.tolist()], dtype=np.str_)
    raise ArtifactError(f"item ids of dtype {ids.dtype} cannot be stored")


def _model_arrays(model: PublicModel) -> dict[str, np.ndarray]:
    return {
        "item_ids": storable_ids(model.item_ids),
        "item_factors": np.asarray(model.item_factors, dtype=np.float64),
        "trained_mask": np.asarray(model.trained_mask, dtype=bool),
        "item_counts": np.asarray(model.item_counts, dtype=np.float64),
        "item_biases": np.asarray(model.item_biases, dtype=np.float64),
    }


def _describe(model: PublicModel) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "algorithm": model.algorithm,
        "rank": model.rank,
        "n_items": model.n_items,
        "n_trained_items": int(np.sum(model.trained_mask)),
        "global_mean": float(model.global_mean),
        "user_reg": asdict(model.user_reg),
        "config": model.config,
        "metadata": model.metadata,
        "event": None if model.event is None else accounting.event_to_json(model.event),
    }


def _digest(npz: bytes, description: dict[str, Any]) -> str:
    """SHA-256 over the array bytes and the canonical JSON of the description."""
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(hashlib.sha256(npz).digest() + canonical.encode()).hexdigest()


def _base_path(path: str | os.PathLike[str]) -> Path:
    base = Path(path)
    return base.with_suffix("") if base.suffix in (".npz", ".json") else base


def write_sealed(path: str | os.PathLike[str], arrays: dict[str, np.ndarray], description: dict[str, Any]) -> ArtifactInfo:
    """Write ``arrays`` to ``<path>.npz`` and ``description`` plus a SHA-256 over both to ``<path>.json``."""
    base = _base_path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # the stub's allow_pickle: bool meets **arrays; no array has that name
    npz = buffer.getvalue()
    sha = _digest(npz, description)
    npz_path, json_path = base.with_suffix(".npz"), base.with_suffix(".json")
    _write_atomically(npz_path, npz)
    _write_atomically(json_path, json.dumps({**description, "sha256": sha}, sort_keys=True, indent=1).encode())
    return ArtifactInfo(npz_path=npz_path, json_path=json_path, sha256=sha, metadata=description)


def read_sealed(
    path: str | os.PathLike[str], *, expected_sha256: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read and verify a :func:`write_sealed` artifact: (arrays, description); ArtifactError on any mismatch."""
    base = _base_path(path)
    try:
        npz = base.with_suffix(".npz").read_bytes()
        stored = json.loads(base.with_suffix(".json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"cannot read artifact {base}: {exc}") from exc
    sha = stored.pop("sha256", None)
    if _digest(npz, stored) != sha:
        raise ArtifactError(f"artifact {base} fails its content hash check")
    if expected_sha256 is not None and sha != expected_sha256:
        raise ArtifactError(f"artifact {base} is not the expected version")
    with np.load(io.BytesIO(npz), allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}, stored


def save_model(model: PublicModel, path: str | os.PathLike[str]) -> ArtifactInfo:
    """Write ``<path>.npz`` and ``<path>.json`` (``path`` may end in ``.npz``); return the hash."""
    return write_sealed(path, _model_arrays(model), _describe(model))


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename: readers never see a partial file, and a failed
    write (a full disk) leaves no temporary file behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_model(path: str | os.PathLike[str], *, expected_sha256: str | None = None) -> PublicModel:
    """Load and verify an artifact written by :func:`save_model`."""
    data, stored = read_sealed(path, expected_sha256=expected_sha256)
    version = stored.get("format_version")
    expected = {1: _ARRAYS_V1, FORMAT_VERSION: _ARRAYS}.get(version) if isinstance(version, int) else None
    if expected is None:
        raise ArtifactError(f"unsupported artifact format {version!r}")
    if set(data) != set(expected):
        raise ArtifactError(f"artifact {path} holds arrays {sorted(data)}, expected {list(expected)}")
    event = stored["event"]
    return PublicModel(
        algorithm=stored["algorithm"],
        item_ids=data["item_ids"],
        item_factors=data["item_factors"],
        trained_mask=data["trained_mask"],
        item_counts=data["item_counts"],
        global_mean=float(stored["global_mean"]),
        user_reg=UserRegularisation(**stored["user_reg"]),
        config=stored["config"],
        event=None if event is None else accounting.event_from_json(event),
        metadata=stored["metadata"],
        item_biases=data.get("item_biases", np.zeros(len(data["item_ids"]))),  # format 1: no item bias
    )
