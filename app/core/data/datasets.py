"""Loaders for the real rating data sets in the shared data folder (never copied into the repo).

Supported: MovieLens-100K (with the standard ``u1`` split and 19 genre flags), MovieLens-1M (with
18 genres from ``movies.dat``, latin-1 encoded) and Jester-1 (continuous ratings in [-10, 10]).
The folder is ``$PRIVREC_DATA_DIR`` if set, else ``<repo root>/../shared/data``; a missing folder
or file raises :class:`DatasetUnavailable` naming the path and how to fix it.

Parsing uses numpy's C CSV reader on the decompressed bytes (ML-1M loads in well under a second).
"""

from __future__ import annotations

import gzip
import io
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from app.core.data.ratings import Ratings

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetUnavailable",
    "data_root",
    "dataset_path",
    "load_dataset",
    "load_jester1",
    "load_ml100k",
    "load_ml100k_u1",
    "load_ml1m",
]

ENV_VAR = "PRIVREC_DATA_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[3]


class DatasetUnavailable(FileNotFoundError):
    """The shared data folder (or one of its files) is missing."""


@dataclass(frozen=True)
class Dataset:
    """A loaded rating data set.

    ``item_features[i]`` holds the public genre tokens of item ``ratings.item_ids[i]`` (empty tuple
    when the item has none); ``None`` when the data set has no item metadata.
    """

    name: str
    ratings: Ratings
    rating_range: tuple[float, float]
    item_features: tuple[tuple[str, ...], ...] | None = None

    def feature_matrix(self, item_ids: np.ndarray | None = None) -> tuple[np.ndarray, sp.csr_matrix]:
        """(sorted tokens, binary CSR tokens x items): features as fictitious users (DP-CMF).

        Columns follow ``item_ids`` (e.g. a split's item space; ids without metadata get an empty
        column), default the data set's own ``ratings.item_ids``.
        """
        if self.item_features is None:
            raise ValueError(f"data set {self.name!r} has no item features")
        by_id = dict(zip(self.ratings.item_ids.tolist(), self.item_features, strict=True))
        ids = self.ratings.item_ids if item_ids is None else np.asarray(item_ids)
        feats = [by_id.get(i, ()) for i in ids.tolist()]
        tokens = np.array(sorted({t for f in feats for t in f}), dtype=object)
        pos = {t: f for f, t in enumerate(tokens.tolist())}
        rows = np.array([pos[t] for f in feats for t in f], dtype=np.int64)
        cols = np.array([j for j, f in enumerate(feats) for _ in f], dtype=np.int64)
        mat = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(tokens), len(feats)))
        return tokens, mat


# ---------------------------------------------------------------------------- paths
def data_root() -> Path:
    """The shared data folder: ``$PRIVREC_DATA_DIR`` or ``<repo root>/../shared/data``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    return (_REPO_ROOT / ".." / "shared" / "data").resolve()


def dataset_path(*parts: str, root: str | Path | None = None) -> Path:
    """Path of a file or folder inside the data root; raise :class:`DatasetUnavailable` if absent."""
    base = Path(root) if root is not None else data_root()
    path = base.joinpath(*parts)
    if not path.exists():
        raise DatasetUnavailable(
            f"rating data not found: {path} does not exist. The real data sets are not part of the "
            f"repository; put them in <repo root>/../shared/data (see its README.md) or point the "
            f"{ENV_VAR} environment variable at a folder that has them."
        )
    return path


# ---------------------------------------------------------------------------- parsing helpers
def _read_bytes(path: Path) -> bytes:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        return fh.read()


def _triples(raw: bytes, delimiter: str, value_dtype: type, skip_header: bool) -> tuple[np.ndarray, ...]:
    """Parse ``user<d>item<d>value[<d>...]`` lines into (users, items, values) arrays.

    A structured dtype lets numpy's C reader convert each column once (about 2x faster than float).
    """
    if skip_header:
        raw = raw.split(b"\n", 1)[1] if b"\n" in raw else b""
    dtype = np.dtype([("u", np.int64), ("i", np.int64), ("v", value_dtype)])
    if not raw.strip():
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64)
    table = np.loadtxt(io.BytesIO(raw), delimiter=delimiter, dtype=dtype, usecols=(0, 1, 2), ndmin=1)
    return table["u"], table["i"], table["v"].astype(np.float64)


def _ratings_from_table(
    users: np.ndarray,
    items: np.ndarray,
    values: np.ndarray,
    rating_range: tuple[float, float],
    *,
    user_ids: np.ndarray | None = None,
    item_ids: np.ndarray | None = None,
) -> Ratings:
    return Ratings.from_arrays(
        users.astype(np.int64),
        items.astype(np.int64),
        values.astype(np.float64),
        user_ids=user_ids,
        item_ids=item_ids,
        rating_range=rating_range,
    )


def _features_for(item_ids: np.ndarray, by_id: dict[int, tuple[str, ...]]) -> tuple[tuple[str, ...], ...]:
    return tuple(by_id.get(int(i), ()) for i in item_ids.tolist())


# ---------------------------------------------------------------------------- MovieLens-100K
ML_RANGE = (1.0, 5.0)


def _ml100k_genres(folder: Path) -> dict[int, tuple[str, ...]]:
    names: dict[int, str] = {}
    for line in (folder / "u.genre").read_text(encoding="latin-1").splitlines():
        if "|" in line:
            name, idx = line.rsplit("|", 1)
            names[int(idx)] = name
    genre_order = [names[i] for i in sorted(names)]
    out: dict[int, tuple[str, ...]] = {}
    for line in (folder / "u.item").read_text(encoding="latin-1").splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        flags = fields[-len(genre_order):]
        out[int(fields[0])] = tuple(g for g, f in zip(genre_order, flags, strict=True) if f.strip() == "1")
    return out


def _ml100k_table(folder: Path, name: str) -> np.ndarray:
    users, items, values = _triples(_read_bytes(dataset_path(name, root=folder)), "\t", np.int64, False)
    return np.stack([users, items, values.astype(np.int64)], axis=1)


# The official release numbers users 1..943 and items 1..1,682 consecutively (its README).
ML100K_USERS = 943
ML100K_ITEMS = 1682


def _official_ml100k_rows(table: np.ndarray, path: Path) -> np.ndarray:
    """Keep rows inside the official id ranges; warn about (and drop) anything appended to the file."""
    ok = (table[:, 0] >= 1) & (table[:, 0] <= ML100K_USERS) & (table[:, 1] >= 1) & (table[:, 1] <= ML100K_ITEMS)
    if not ok.all():
        bad_users = np.unique(table[~ok, 0])
        warnings.warn(
            f"{path}: dropped {int((~ok).sum())} row(s) outside the official MovieLens-100K id ranges "
            f"(users 1..{ML100K_USERS}, items 1..{ML100K_ITEMS}); e.g. user ids {bad_users[:5].tolist()}",
            stacklevel=3,
        )
    return table[ok]


def load_ml100k(
    root: str | Path | None = None, *, with_features: bool = True, official_only: bool = True
) -> Dataset:
    """MovieLens-100K (``u.data.gz``): 100,000 ratings, 943 users x 1,682 items, 1..5, 19 genres.

    With ``official_only`` (default) rows outside the official id ranges are dropped with a warning
    (the shared copy has 349 extra rows from user ids 995-998 appended).
    """
    folder = dataset_path("ml-100k", root=root)
    table = _ml100k_table(folder, "u.data.gz")
    if official_only:
        table = _official_ml100k_rows(table, folder / "u.data.gz")
    ratings = _ratings_from_table(table[:, 0], table[:, 1], table[:, 2], ML_RANGE)
    feats = _features_for(ratings.item_ids, _ml100k_genres(folder)) if with_features else None
    return Dataset("ml-100k", ratings, ML_RANGE, feats)


def load_ml100k_u1(root: str | Path | None = None) -> tuple[Ratings, Ratings]:
    """The standard ML-100K ``u1.base`` / ``u1.test`` split, sharing the full data set's id spaces."""
    folder = dataset_path("ml-100k", root=root)
    user_ids = np.arange(1, ML100K_USERS + 1, dtype=np.int64)
    item_ids = np.arange(1, ML100K_ITEMS + 1, dtype=np.int64)
    out = []
    for name in ("u1.base.gz", "u1.test.gz"):
        t = _ml100k_table(folder, name)
        out.append(_ratings_from_table(t[:, 0], t[:, 1], t[:, 2], ML_RANGE, user_ids=user_ids, item_ids=item_ids))
    return out[0], out[1]


# ---------------------------------------------------------------------------- MovieLens-1M
def _ml1m_genres(folder: Path) -> dict[int, tuple[str, ...]]:
    out: dict[int, tuple[str, ...]] = {}
    text = dataset_path("movies.dat", root=folder).read_text(encoding="latin-1")
    for line in text.splitlines():
        if not line.strip():
            continue
        mid, _title, genres = line.split("::")
        out[int(mid)] = tuple(g for g in genres.strip().split("|") if g)
    return out


def load_ml1m(root: str | Path | None = None, *, with_features: bool = True) -> Dataset:
    """MovieLens-1M (``ratings.csv.gz``): 1,000,202 ratings, 6,040 users x 3,706 items, 18 genres."""
    folder = dataset_path("ml-1m", root=root)
    users, items, values = _triples(_read_bytes(dataset_path("ratings.csv.gz", root=folder)), ",", np.int64, True)
    ratings = _ratings_from_table(users, items, values, ML_RANGE)
    feats = _features_for(ratings.item_ids, _ml1m_genres(folder)) if with_features else None
    return Dataset("ml-1m", ratings, ML_RANGE, feats)


# ---------------------------------------------------------------------------- Jester-1
JESTER_RANGE = (-10.0, 10.0)


def load_jester1(root: str | Path | None = None) -> Dataset:
    """Jester-1 (``ratings.csv.gz``): 1,810,455 continuous ratings in [-10, 10], 100 jokes, no features."""
    folder = dataset_path("jester-1", root=root)
    users, items, values = _triples(_read_bytes(dataset_path("ratings.csv.gz", root=folder)), ",", np.float64, True)
    ratings = _ratings_from_table(users, items, values, JESTER_RANGE)
    return Dataset("jester-1", ratings, JESTER_RANGE, None)


DATASETS: dict[str, Callable[..., Dataset]] = {
    "ml-100k": load_ml100k,
    "ml-1m": load_ml1m,
    "jester-1": load_jester1,
}


def load_dataset(name: str, root: str | Path | None = None) -> Dataset:
    """Load a data set by name (one of :data:`DATASETS`)."""
    try:
        loader = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown data set {name!r}; known: {sorted(DATASETS)}") from None
    return loader(root)
