"""Dataset loaders: parsers on tiny fixture folders, plus the real shared data when present."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import numpy as np
import pytest

from app.core.data import datasets as ds
from tests.conftest import require_data


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write(text)


@pytest.fixture()
def tiny_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    _gz(root / "ml-100k" / "u.data.gz", "1\t1\t5\t881250949\n2\t3\t1\t881250949\n1\t2\t3\t1\n")
    _gz(root / "ml-100k" / "u1.base.gz", "1\t1\t5\t0\n2\t3\t1\t0\n")
    _gz(root / "ml-100k" / "u1.test.gz", "1\t2\t3\t0\n")
    (root / "ml-100k" / "u.genre").write_text("unknown|0\nAction|1\nComedy|2\n\n")
    (root / "ml-100k" / "u.item").write_bytes(
        "1|Caf\xe9 (1995)|01-Jan-1995||http://x|0|1|1\n2|B|01-Jan-1995||http://x|1|0|0\n"
        "3|C|01-Jan-1995||http://x|0|0|0\n".encode("latin-1")
    )
    _gz(root / "ml-1m" / "ratings.csv.gz", "user_id,item_id,rating\n10,7,4\n11,7,2\n10,9,5\n")
    (root / "ml-1m" / "movies.dat").write_bytes(
        "7::Am\xe9lie (2001)::Comedy|Romance\n9::X (1999)::Action\n8::Unrated (1990)::Drama\n".encode("latin-1")
    )
    _gz(root / "jester-1" / "ratings.csv.gz", "user_id,item_id,rating\n1,1,-7.82\n1,2,8.79\n2,1,0.0\n")
    return root


def test_missing_folder_raises_clear_error(tmp_path: Path):
    with pytest.raises(ds.DatasetUnavailable) as exc:
        ds.load_ml1m(tmp_path / "nowhere")
    assert isinstance(exc.value, FileNotFoundError)
    assert "nowhere" in str(exc.value) and ds.ENV_VAR in str(exc.value)


def test_data_root_honours_env(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ds.ENV_VAR, str(tmp_path))
    assert ds.data_root() == tmp_path.resolve()
    monkeypatch.delenv(ds.ENV_VAR)
    assert ds.data_root() == (Path(ds.__file__).resolve().parents[3].parent / "shared" / "data").resolve()


def test_tiny_ml100k_with_genres(tiny_root: Path):
    d = ds.load_ml100k(tiny_root)
    r = d.ratings
    assert (r.nnz, r.n_users, r.n_items) == (3, 2, 3)
    assert d.rating_range == (1.0, 5.0)
    assert r.csr[r.user_index(1), 0] == 5.0
    assert d.item_features == (("Action", "Comedy"), ("unknown",), ())
    tokens, mat = d.feature_matrix()
    assert list(tokens) == ["Action", "Comedy", "unknown"]
    assert mat.shape == (3, 3) and mat.nnz == 3


def test_ml100k_drops_rows_outside_official_ids(tiny_root: Path):
    _gz(tiny_root / "ml-100k" / "u.data.gz", "1\t1\t5\t0\n995\t1\t4\t0\n")
    with pytest.warns(UserWarning, match="dropped 1 row"):
        d = ds.load_ml100k(tiny_root)
    assert d.ratings.nnz == 1
    assert ds.load_ml100k(tiny_root, official_only=False).ratings.nnz == 2


def test_tiny_ml100k_u1_shares_official_id_space(tiny_root: Path):
    base, test = ds.load_ml100k_u1(tiny_root)
    assert base.n_users == test.n_users == ds.ML100K_USERS
    assert base.n_items == test.n_items == ds.ML100K_ITEMS
    assert (base.nnz, test.nnz) == (2, 1)


def test_tiny_ml1m_latin1_genres(tiny_root: Path):
    d = ds.load_ml1m(tiny_root)
    assert list(d.ratings.item_ids) == [7, 9]
    assert d.item_features == (("Comedy", "Romance"), ("Action",))


def test_tiny_jester_continuous_range(tiny_root: Path):
    d = ds.load_dataset("jester-1", tiny_root)
    assert d.rating_range == (-10.0, 10.0) and d.item_features is None
    assert sorted(d.ratings.csr.data.tolist()) == [-7.82, 0.0, 8.79]
    with pytest.raises(ValueError, match="features"):
        d.feature_matrix()


def test_out_of_range_rating_is_rejected(tiny_root: Path):
    _gz(tiny_root / "jester-1" / "ratings.csv.gz", "user_id,item_id,rating\n1,1,10.5\n")
    with pytest.raises(ValueError, match="outside"):
        ds.load_jester1(tiny_root)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="unknown data set"):
        ds.load_dataset("netflix")


# ---------------------------------------------------------------------------- real data
@pytest.mark.data
def test_real_ml100k_counts():
    require_data("ml-100k")
    with pytest.warns(UserWarning):  # the shared copy has rows appended beyond the official ids
        d = ds.load_ml100k()
    r = d.ratings
    assert (r.nnz, r.n_users, r.n_items) == (100_000, 943, 1682)
    assert set(np.unique(r.csr.data)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert len(d.item_features) == 1682 and d.item_features[0] == ("Animation", "Children's", "Comedy")
    base, test = ds.load_ml100k_u1()
    assert (base.nnz, test.nnz) == (80_000, 20_000)


@pytest.mark.data
def test_real_ml1m_counts():
    require_data("ml-1m")
    t0 = time.perf_counter()
    d = ds.load_ml1m()
    print(f"ML-1M loaded in {time.perf_counter() - t0:.2f} s")
    r = d.ratings
    assert (r.nnz, r.n_users, r.n_items) == (1_000_202, 6040, 3706)
    tokens, mat = d.feature_matrix()
    assert len(tokens) == 18 and mat.shape == (18, 3706)
    assert all(len(f) > 0 for f in d.item_features)


@pytest.mark.data
def test_real_jester_counts():
    require_data("jester-1")
    r = ds.load_jester1().ratings
    assert (r.nnz, r.n_users, r.n_items) == (1_810_455, 24_983, 100)
    assert r.csr.data.min() >= -10.0 and r.csr.data.max() <= 10.0


def test_missing_data_skips_outside_ci_and_fails_under_ci(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ds.ENV_VAR, str(tmp_path / "absent"))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="PRIVREC_DATA_DIR"):
        require_data("ml-1m")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_data("ml-1m")


@pytest.mark.data
def test_shared_data_dir_fixture_points_at_the_data(shared_data_dir: Path):
    assert (shared_data_dir / "README.md").exists()
    assert shared_data_dir == ds.data_root()


def test_feature_matrix_follows_given_item_space(tiny_root: Path):
    d = ds.load_ml1m(tiny_root)
    tokens, mat = d.feature_matrix(np.array([9, 8, 12345]))
    assert list(tokens) == ["Action"]  # item 8 has no ratings, 12345 is unknown: empty columns
    assert mat.toarray().tolist() == [[1.0, 0.0, 0.0]]
