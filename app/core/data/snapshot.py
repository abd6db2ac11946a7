"""A rating matrix exported as a Parquet snapshot in user partitions, read back on the workers (issue 28).

The export step (:func:`write_snapshot`) writes one Parquet file per user partition, taking the
partitions one at a time (an iterable: the writer never needs the whole matrix), then the catalogue
and, last, a manifest; a cluster reads it back with one :class:`ParquetPartition` per file
(:func:`open_snapshot`), each run by the task that uses its partition, on shared storage.

Layout of ``directory``::

    part-00000.parquet ...   one per partition: ``user_id`` (the partition's users' ids, int64 or
                             string), ``item`` (int32: the position in the catalogue), ``value``
                             (float64); rows grouped by user, each user's items ascending
    items.parquet            the catalogue: ``item_id``, in position order
    manifest.json            format, version, the snapshot's id, the item count, and per partition
                             its file, its ratings and its users

Values are stored as float64, the type every :class:`Ratings` holds, so they round-trip exactly and
a model trained from a snapshot is the one trained from the matrix, bit for bit (half-star ratings
cost little: Parquet's dictionary encoding stores each distinct value once per page). A user
without ratings has no row, so she is not in the snapshot (nor in a ``COPY`` of the ratings table);
no statistic counts her (the count histogram and the user-level mean skip empty users, and her
factor is zero).

The manifest is written last, atomically (a rename): a directory without one is an export that did
not finish and is refused. Every file carries the snapshot's id and its partition number in its
Parquet key-value metadata, and every reader checks them, its row count and its catalogue size
against the manifest, so a file from another snapshot, a truncated file or an edited manifest raises
:class:`SnapshotError` instead of training on other data.

pyarrow is the optional ``dask`` extra: it is imported only when a snapshot is written or read.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.core.data.partitioned import PartitionedRatings
from app.core.data.ratings import Ratings

__all__ = ["FORMAT", "VERSION", "SnapshotError", "ParquetPartition", "write_snapshot", "open_snapshot",
           "read_manifest"]

FORMAT = "privrec-ratings-snapshot"
VERSION = 1
MANIFEST = "manifest.json"
CATALOGUE = "items.parquet"
_SNAPSHOT_KEY = b"privrec.snapshot"
_PARTITION_KEY = b"privrec.partition"
#: a partition given as (its users' ids, row index into them, item position, value) per rating
Triplets = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class SnapshotError(RuntimeError):
    """A snapshot that is incomplete, corrupted or not the one its manifest describes."""


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - the optional extra is missing
        raise ImportError("Parquet snapshots need pyarrow, the optional 'dask' extra: pip install .[dask]") from exc
    return pa, pq


def _file_name(partition: int) -> str:
    return f"part-{partition:05d}.parquet"


def _triplets(partition: Ratings | Triplets, n_items: int) -> Triplets:
    """(user ids, rows, item positions, values) of a partition, rows grouped by user in CSR order."""
    if isinstance(partition, Ratings):
        if partition.n_items != n_items:
            raise ValueError("a partition is over a different catalogue")
        rows, cols, vals = partition.coo()
        return np.asarray(partition.user_ids), rows, cols, vals
    user_ids, rows, cols, vals = (np.asarray(a) for a in partition)
    data = Ratings.from_indices(rows, cols, vals, user_ids=user_ids, item_ids=np.arange(n_items))  # checks, sorts
    rows, cols, vals = data.coo()
    return user_ids, rows, cols, vals


def _id_array(pa: Any, ids: np.ndarray) -> Any:
    """An id column: int64 for integer ids, string for any other."""
    if ids.dtype.kind in "iu":
        return pa.array(ids.astype(np.int64), type=pa.int64())
    return pa.array([str(x) for x in ids.tolist()], type=pa.string())


def _ids(column: Any) -> np.ndarray:
    """An id column as numpy (int64, or str)."""
    values = column.to_numpy(zero_copy_only=False)
    return values if values.dtype.kind in "iu" else np.asarray(values.tolist(), dtype=str)


def write_snapshot(directory: str | os.PathLike[str], partitions: Iterable[Ratings | Triplets],
                   item_ids: np.ndarray) -> dict[str, Any]:
    """Write ``partitions`` (each a :class:`Ratings` over the catalogue ``item_ids`` or a
    (user ids, rows, item positions, values) tuple; every user in one partition) as a snapshot in
    ``directory`` (created; it must hold no snapshot yet), one partition at a time; return the manifest."""
    pa, pq = _pyarrow()
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    if any(target.iterdir()):
        raise SnapshotError(f"{target} is not empty: a snapshot is written into a new directory")
    item_ids = np.asarray(item_ids)
    n_items = len(item_ids)
    if n_items >= 2**31:
        raise ValueError("a snapshot's catalogue holds fewer than 2^31 items")
    snapshot = uuid.uuid4().hex
    files = []
    for p, partition in enumerate(partitions):
        user_ids, rows, cols, vals = _triplets(partition, n_items)
        present = np.unique(rows)  # users with a rating (the others are not stored)
        table = pa.table({"user_id": _id_array(pa, user_ids[rows]),
                          "item": pa.array(cols.astype(np.int32), type=pa.int32()),
                          "value": pa.array(np.asarray(vals, dtype=np.float64), type=pa.float64())})
        table = table.replace_schema_metadata({_SNAPSHOT_KEY: snapshot.encode(), _PARTITION_KEY: str(p).encode()})
        pq.write_table(table, target / _file_name(p))
        files.append({"file": _file_name(p), "ratings": int(len(vals)), "users": int(len(present))})
    if not files:
        raise ValueError("a snapshot needs at least one partition")
    catalogue = pa.table({"item_id": _id_array(pa, item_ids)})
    pq.write_table(catalogue.replace_schema_metadata({_SNAPSHOT_KEY: snapshot.encode()}), target / CATALOGUE)
    manifest = {"format": FORMAT, "version": VERSION, "snapshot": snapshot, "items": n_items,
                "partitions": files}
    partial = target / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=1))
    partial.replace(target / MANIFEST)  # last and atomic: a snapshot with a manifest is complete
    return manifest


def _count(entry: dict[str, Any], name: str) -> int:
    value = entry.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SnapshotError(f"the manifest's {name} count is not a count")
    return value


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot's manifest, checked: format, version, the partition files named in order, counts."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise SnapshotError(f"no {MANIFEST} in {directory}: not a snapshot, or its export did not finish")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"the snapshot's {MANIFEST} is unreadable: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SnapshotError(f"{path} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise SnapshotError(f"snapshot format version {manifest.get('version')!r}; this reader reads {VERSION}")
    if not isinstance(manifest.get("snapshot"), str):
        raise SnapshotError("the manifest names no snapshot id")
    _count(manifest, "items")
    files = manifest.get("partitions")
    if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files):
        raise SnapshotError("the manifest lists no partitions")
    for p, entry in enumerate(files):
        if entry.get("file") != _file_name(p):
            raise SnapshotError(f"the manifest's partition {p} names {entry.get('file')!r}, not {_file_name(p)!r}")
        _count(entry, "ratings")
        _count(entry, "users")
    return manifest


def _check_file(metadata: Any, what: str, snapshot: str, partition: int | None) -> None:
    """The file's key-value metadata names this snapshot (and this partition)."""
    keys = metadata.metadata or {}
    if keys.get(_SNAPSHOT_KEY) != snapshot.encode():
        raise SnapshotError(f"{what} belongs to another snapshot than its manifest")
    if partition is not None and keys.get(_PARTITION_KEY) != str(partition).encode():
        raise SnapshotError(f"{what} is not partition {partition} of its snapshot")


@dataclass(frozen=True)
class ParquetPartition:
    """Reads one partition of a snapshot (a :class:`~app.core.data.partitioned.PartitionReader`,
    run on a worker): its users' ratings over the snapshot's catalogue, checked against the
    counts its manifest gave when the snapshot was opened."""

    directory: str
    snapshot: str
    partition: int
    ratings: int
    users: int
    items: int

    def __call__(self) -> Ratings:
        _, pq = _pyarrow()
        folder = Path(self.directory)
        path = folder / _file_name(self.partition)
        what = f"partition {self.partition} ({path.name})"
        try:
            handle = pq.ParquetFile(path)
            _check_file(handle.metadata, what, self.snapshot, self.partition)
            if handle.metadata.num_rows != self.ratings:
                raise SnapshotError(f"{what} holds {handle.metadata.num_rows} ratings; its manifest says {self.ratings}")
            # one column at a time, each freed before the next: the read's peak stays near the matrix's own size
            indptr, user_ids = _user_runs(_ids(handle.read(columns=["user_id"]).column(0)))
            cols = _numbers(handle.read(columns=["item"]).column(0), np.int32)
            vals = _numbers(handle.read(columns=["value"]).column(0), np.float64)
        except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors derive from these
            raise SnapshotError(f"{what} is unreadable: {exc}") from exc
        item_ids = _catalogue(folder, self.snapshot, self.items)
        if len(user_ids) != self.users:
            raise SnapshotError(f"{what} holds {len(user_ids)} users' runs; its manifest says {self.users}")
        if len(cols) and (cols.min() < 0 or cols.max() >= self.items):
            raise SnapshotError(f"{what} names item positions outside its catalogue")
        if len(np.unique(user_ids)) != len(user_ids):
            raise SnapshotError(f"{what} is corrupted: a user's ratings are not in one run")
        try:  # a (user, item) pair twice, a user's items out of order, a non-finite value
            ratings = Ratings.from_csr(indptr, cols, vals, user_ids=user_ids, item_ids=item_ids)
        except ValueError as exc:
            raise SnapshotError(f"{what} is corrupted: {exc}") from exc
        pa, _ = _pyarrow()
        pa.default_memory_pool().release_unused()  # the freed columns' pages go back to the system
        return ratings


def _user_runs(users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(CSR row pointer, user id of each row) of a user column whose rows come in one run per user."""
    if not len(users):
        return np.zeros(1, dtype=np.int64), users[:0]
    starts = np.flatnonzero(users[1:] != users[:-1]) + 1
    return np.r_[0, starts, len(users)].astype(np.int64), users[np.r_[0, starts]]


def _numbers(column: Any, dtype: type) -> np.ndarray:
    """A numeric column as numpy of ``dtype`` (no copy where its one chunk already is)."""
    return np.asarray(column.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def _catalogue(folder: Path, snapshot: str, items: int) -> np.ndarray:
    """The snapshot's item ids, checked against its manifest."""
    _, pq = _pyarrow()
    try:
        handle = pq.ParquetFile(folder / CATALOGUE)
        _check_file(handle.metadata, "the catalogue", snapshot, None)
        item_ids = _ids(handle.read(columns=["item_id"]).column("item_id"))
    except (OSError, ValueError, KeyError) as exc:
        raise SnapshotError(f"the snapshot's catalogue is unreadable: {exc}") from exc
    if len(item_ids) != items:
        raise SnapshotError(f"the catalogue holds {len(item_ids)} items; the manifest says {items}")
    return item_ids


def open_snapshot(directory: str | os.PathLike[str], excluded_labels: frozenset[str] = frozenset()) -> PartitionedRatings:
    """The snapshot in ``directory`` as a :class:`PartitionedRatings`: its catalogue (read here:
    public) and one :class:`ParquetPartition` per file; ``excluded_labels`` as there."""
    manifest = read_manifest(directory)
    folder = str(Path(directory).resolve())
    found = sorted(path.name for path in Path(folder).glob("part-*.parquet"))
    if found != [entry["file"] for entry in manifest["partitions"]]:
        raise SnapshotError(f"the snapshot holds {len(found)} partition files; its manifest lists "
                            f"{len(manifest['partitions'])}")
    snapshot, items = manifest["snapshot"], manifest["items"]
    readers = tuple(ParquetPartition(folder, snapshot, p, entry["ratings"], entry["users"], items)
                    for p, entry in enumerate(manifest["partitions"]))
    return PartitionedRatings(_catalogue(Path(folder), snapshot, items), readers, excluded_labels)
