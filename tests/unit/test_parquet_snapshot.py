"""Parquet snapshots of a rating matrix in user partitions (issue 28, :mod:`app.core.data.snapshot`).

Written partition by partition, read back one reader per file: the values round-trip exactly, the
partitions gather to the matrix, and a model trained from the snapshot (in process, or by the
distributed driver with its readers as tasks) is the one trained from the matrix, bit for bit, with
the same ledger event. An incomplete, corrupted or mismatched snapshot is refused with a clear error.
Needs pyarrow (the optional ``dask`` extra); skipped without it.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.core.data.partitioned import gather
from app.core.data.ratings import Ratings
from app.core.mf import dpals
from app.core.mf.distributed import InProcess, distributed_fit, split_users
from app.core.mf.dpals import DPALSConfig, train_dpals
from tests.unit.test_dpals_partitions import N_ITEMS, PARTITIONINGS, SEED, _published, _ratings, default_config

pq = pytest.importorskip("pyarrow.parquet", reason="the optional 'dask' extra (pyarrow) is not installed")

from app.core.data.snapshot import (  # noqa: E402 - after the skip
    ParquetPartition,
    SnapshotError,
    open_snapshot,
    read_manifest,
    write_snapshot,
)


def _with_a_silent_user(ratings: Ratings) -> Ratings:
    """``ratings`` plus one user without ratings (she is not stored; no statistic counts her)."""
    rows, cols, vals = ratings.coo()
    user_ids = np.r_[ratings.user_ids, 10**13]
    return Ratings.from_indices(rows, cols, vals, user_ids=user_ids, item_ids=ratings.item_ids)


def _by_user(ratings: Ratings) -> dict:
    """Each user with a rating: (item ids, values), by user id."""
    out = {}
    for u, user in enumerate(ratings.user_ids.tolist()):
        items, values = ratings.user_row(u)
        if len(items):
            out[user] = (ratings.item_ids[items].tolist(), values.tobytes())
    return out


def _snapshot(tmp_path: Path, ratings: Ratings, partitioning: str = "three-by-id") -> Path:
    directory = tmp_path / "snapshot"
    labels = PARTITIONINGS[partitioning](np.asarray(ratings.user_ids))
    write_snapshot(directory, (p for p in split_users(ratings, labels)), ratings.item_ids)
    return directory


@pytest.mark.parametrize("partitioning", sorted(PARTITIONINGS))
def test_each_partition_round_trips_exactly(tmp_path: Path, partitioning: str):
    ratings = _ratings(2)
    values = ratings.csr.data.copy()
    values[::3] = np.random.default_rng(0).uniform(1.0, 5.0, size=len(values[::3]))  # full float64 mantissas
    ratings = Ratings.from_indices(*ratings.coo()[:2], values, user_ids=ratings.user_ids, item_ids=ratings.item_ids)
    parts = split_users(ratings, PARTITIONINGS[partitioning](np.asarray(ratings.user_ids)))
    manifest = write_snapshot(tmp_path / "s", iter(parts), ratings.item_ids)
    data = open_snapshot(tmp_path / "s")
    assert data.n_partitions == len(parts) == len(manifest["partitions"])
    np.testing.assert_array_equal(data.item_ids, ratings.item_ids)
    for reader, part, entry in zip(data.readers, parts, manifest["partitions"], strict=True):
        got = pickle.loads(pickle.dumps(reader))()  # as a worker runs it
        assert entry["ratings"] == got.nnz == part.nnz
        np.testing.assert_array_equal(got.user_ids, part.user_ids[part.user_counts() > 0])  # the same order
        for name in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got.csr, name), getattr(part.csr[part.user_counts() > 0], name))
        assert got.csr.data.dtype == np.float64 and got.csr.data.tobytes() == part.csr.data.tobytes()


def test_the_partitions_gather_to_the_matrix_and_tuples_write_the_same(tmp_path: Path):
    ratings = _with_a_silent_user(_ratings(3))
    directory = _snapshot(tmp_path, ratings, "two-by-hash")
    gathered = gather(open_snapshot(directory))
    assert _by_user(gathered) == _by_user(ratings) and gathered.nnz == ratings.nnz
    assert 10**13 not in gathered.user_ids.tolist()  # the user without ratings is not stored
    labels = PARTITIONINGS["two-by-hash"](np.asarray(ratings.user_ids))
    tuples = ((p.user_ids, *p.coo()) for p in split_users(ratings, labels))
    write_snapshot(tmp_path / "tuples", tuples, ratings.item_ids)
    assert _by_user(gather(open_snapshot(tmp_path / "tuples"))) == _by_user(ratings)


def test_string_ids_round_trip(tmp_path: Path):
    base = _ratings(4, n_users=30)
    ratings = Ratings.from_indices(*base.coo(), user_ids=np.array([f"u{u}" for u in base.user_ids.tolist()]),
                                   item_ids=np.array([f"item-{i}" for i in range(N_ITEMS)]))
    write_snapshot(tmp_path / "s", [ratings], ratings.item_ids)
    data = open_snapshot(tmp_path / "s")
    assert data.item_ids.tolist() == ratings.item_ids.tolist()
    assert _by_user(gather(data)) == _by_user(ratings)


CONFIGS = {
    "default rule 8": lambda: default_config("rating"),
    "ranking default": lambda: default_config("ranking"),
    "adaptive, gravity, pooling": lambda: DPALSConfig(
        rank=5, n_steps=3, contribution_bound=7, frequent_fraction=0.8, noise_multiplier=0.7, reg_gravity=0.3,
        gram_pooling=1.0, average_last=2, seed=SEED),
}


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_a_model_from_the_snapshot_is_the_matrix_model(tmp_path: Path, variant: str):
    """In process (the readers gathered) and by the distributed driver (each reader a task), the
    published model and its event are the matrix's, bit for bit."""
    ratings = _with_a_silent_user(_ratings(5, n_users=200))
    config = CONFIGS[variant]()
    reference = train_dpals(ratings, config)
    data = open_snapshot(_snapshot(tmp_path, ratings, "four-random-one-empty"))
    for model in (train_dpals(data, config), train_dpals(data, config, fit=distributed_fit(InProcess()))):
        for got, want in zip(_published(model), _published(reference), strict=True):
            np.testing.assert_array_equal(got, want)
        assert model.event == reference.event == dpals.dpals_event(config)
        assert model.metadata == reference.metadata
    other = train_dpals(data, replace(config, seed=SEED + 1))
    assert not np.array_equal(other.item_factors, reference.item_factors)  # not vacuous


def test_an_unfinished_or_mismatched_snapshot_is_refused(tmp_path: Path):
    ratings = _ratings(6)
    directory = _snapshot(tmp_path, ratings)
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())

    def with_manifest(edit) -> Path:
        copy = tmp_path / f"edited-{len(list(tmp_path.iterdir()))}"
        copy.mkdir()
        for path in directory.iterdir():
            (copy / path.name).write_bytes(path.read_bytes())
        edited = json.loads(json.dumps(manifest))
        edit(edited)
        (copy / "manifest.json").write_text(json.dumps(edited))
        return copy

    with pytest.raises(SnapshotError, match="not empty"):
        write_snapshot(directory, [ratings], ratings.item_ids)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "part-00000.parquet").write_bytes((directory / "part-00000.parquet").read_bytes())
    with pytest.raises(SnapshotError, match="did not finish"):
        open_snapshot(unfinished)
    with pytest.raises(SnapshotError, match="version"):
        open_snapshot(with_manifest(lambda m: m.update(version=2)))
    with pytest.raises(SnapshotError, match="partition files"):
        open_snapshot(with_manifest(lambda m: m["partitions"].pop()))
    with pytest.raises(SnapshotError, match="catalogue holds"):
        open_snapshot(with_manifest(lambda m: m.update(items=N_ITEMS + 1)))
    with pytest.raises(SnapshotError, match="another snapshot"):
        open_snapshot(with_manifest(lambda m: m.update(snapshot="0" * 32)))
    edited = open_snapshot(with_manifest(lambda m: m["partitions"][1].update(ratings=m["partitions"][1]["ratings"] - 1)))
    with pytest.raises(SnapshotError, match="partition 1 .* ratings; its manifest says"):
        edited.readers[1]()
    edited = open_snapshot(with_manifest(lambda m: m["partitions"][0].update(users=m["partitions"][0]["users"] + 1)))
    with pytest.raises(SnapshotError, match="users"):
        edited.readers[0]()
    swapped = with_manifest(lambda m: None)  # partition 2's file where partition 0's belongs
    (swapped / "part-00000.parquet").write_bytes((directory / "part-00002.parquet").read_bytes())
    with pytest.raises(SnapshotError, match="not partition 0"):
        open_snapshot(swapped).readers[0]()
    other = tmp_path / "other"
    write_snapshot(other, split_users(ratings, PARTITIONINGS["three-by-id"](np.asarray(ratings.user_ids))),
                   ratings.item_ids)
    mixed = with_manifest(lambda m: None)  # another export's file of the same partition
    (mixed / "part-00001.parquet").write_bytes((other / "part-00001.parquet").read_bytes())
    with pytest.raises(SnapshotError, match="another snapshot"):
        open_snapshot(mixed).readers[1]()
    truncated = with_manifest(lambda m: None)
    body = (directory / "part-00001.parquet").read_bytes()
    (truncated / "part-00001.parquet").write_bytes(body[: len(body) // 2])
    with pytest.raises(SnapshotError, match="unreadable"):
        open_snapshot(truncated).readers[1]()
    assert read_manifest(directory) == manifest


def test_a_reader_is_a_small_picklable_value():
    reader = ParquetPartition("/data/snapshot", "ab" * 16, 3, 10, 2, N_ITEMS)
    assert pickle.loads(pickle.dumps(reader)) == reader and len(pickle.dumps(reader)) < 400


def test_the_core_imports_without_pyarrow():
    code = ("import sys; sys.modules['pyarrow'] = None; import app.core.data.snapshot, app.core.mf.distributed; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def _same_matrix(a: Ratings, b: Ratings) -> None:
    for got, want in ((a.csr, b.csr), (a.csc, b.csc)):
        for name in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
            assert getattr(got, name).dtype == getattr(want, name).dtype, name
    assert a.user_ids.tolist() == b.user_ids.tolist() and a.item_ids.tolist() == b.item_ids.tolist()


def test_a_matrix_built_from_its_rows_is_the_one_built_from_its_entries():
    """:meth:`Ratings.from_csr` (the reader's path, no sort) gives :meth:`Ratings.from_indices`'s
    matrix, empty rows at the start, middle and end included; out-of-order, duplicate, out-of-range
    and non-finite entries raise."""
    base = _ratings(11, n_users=40)
    rows, cols, vals = base.coo()
    user_ids = np.r_[-1, base.user_ids[:20], -2, base.user_ids[20:], -3]  # three users without ratings
    position = np.r_[np.arange(1, 21), np.arange(22, len(user_ids) - 1)]
    want = Ratings.from_indices(position[rows], cols, vals, user_ids=user_ids, item_ids=base.item_ids)
    indptr = want.csr.indptr.astype(np.int64)
    _same_matrix(Ratings.from_csr(indptr, want.csr.indices, want.csr.data, user_ids=user_ids,
                                  item_ids=base.item_ids), want)
    row = int(np.argmax(np.diff(indptr) >= 2))  # a row with two entries
    a, b = indptr[row], indptr[row] + 1

    def broken(edit) -> tuple[np.ndarray, np.ndarray]:
        c, v = want.csr.indices.copy(), want.csr.data.copy()
        edit(c, v)
        return c, v

    def swap(c, v):
        c[[a, b]] = c[[b, a]]

    def repeat(c, v):
        c[b] = c[a]

    def outside(c, v):
        c[a] = N_ITEMS

    def nan(c, v):
        v[a] = np.nan

    cases = {swap: "ascending", repeat: "ascending", outside: "outside", nan: "NaN"}
    for edit, message in cases.items():
        c, v = broken(edit)
        with pytest.raises(ValueError, match=message):
            Ratings.from_csr(indptr, c, v, user_ids=user_ids, item_ids=base.item_ids)


def test_a_corrupted_partition_file_is_refused(tmp_path: Path):
    """A partition file that carries its snapshot's marks but whose rows break the layout: a user's
    items out of order, a pair twice, a user in two runs, a NaN."""
    ratings = _ratings(12, n_users=30)
    directory = _snapshot(tmp_path, ratings)
    path = directory / "part-00000.parquet"
    table = pq.read_table(path)
    users, items, values = (table.column(name).to_numpy().copy() for name in ("user_id", "item", "value"))
    first_run = int(np.argmax(users != users[0]))  # the first user's ratings end here

    def written(u: np.ndarray, i: np.ndarray, v: np.ndarray) -> ParquetPartition:
        import pyarrow as pa

        edited = pa.table({"user_id": u, "item": i.astype(np.int32), "value": v})
        pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)
        return open_snapshot(directory).readers[0]

    out_of_order = items.copy()
    out_of_order[[0, 1]] = out_of_order[[1, 0]]
    twice = items.copy()
    twice[1] = twice[0]
    nan = values.copy()
    nan[2] = np.nan
    for reader in (written(users, out_of_order, values), written(users, twice, values),
                   written(users, items, nan)):
        with pytest.raises(SnapshotError, match="corrupted"):
            reader()
    ahead = np.r_[first_run, np.arange(first_run), np.arange(first_run + 1, len(users))]  # a second user's rating first
    reader = written(users[ahead], items[ahead], values[ahead])
    with pytest.raises(SnapshotError, match="users' runs|one run"):
        reader()
