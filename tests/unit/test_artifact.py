"""Model artifacts: round trip, content hash, no pickles, nothing private."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.core.data.ratings import Ratings
from app.core.mf.artifact import ArtifactError, load_model, save_model
from app.core.mf.dpals import DPALSConfig, train_dpals


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    users, items = np.nonzero(rng.random((50, 20)) < 0.4)
    item_names = np.array([f"movie-{i}" for i in range(20)])
    ratings = Ratings.from_arrays(users, item_names[items], rng.integers(1, 6, len(users)).astype(float))
    return train_dpals(ratings, DPALSConfig(rank=3, contribution_bound=5, noise_multiplier=2.0))


def test_a_format_1_artifact_loads_with_zero_item_biases(tmp_path, model):
    from app.core.mf.artifact import _describe, _model_arrays, write_sealed

    arrays = {k: v for k, v in _model_arrays(model).items() if k != "item_biases"}
    info = write_sealed(tmp_path / "old", arrays, {**_describe(model), "format_version": 1})
    loaded = load_model(info.npz_path, expected_sha256=info.sha256)
    assert np.array_equal(loaded.item_factors, model.item_factors)
    assert np.any(model.item_biases) and not np.any(loaded.item_biases)


def test_the_noise_seed_is_never_published(tmp_path, model):
    info = save_model(model, tmp_path / "v1")
    assert "seed" not in model.config
    assert '"seed"' not in info.json_path.read_text()


def test_tampering_is_detected(tmp_path, model):
    info = save_model(model, tmp_path / "v1")
    meta = json.loads(info.json_path.read_text())
    meta["global_mean"] += 0.1
    info.json_path.write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="hash"):
        load_model(info.npz_path)


def test_wrong_version_is_refused(tmp_path, model):
    info = save_model(model, tmp_path / "v1")
    with pytest.raises(ArtifactError, match="expected"):
        load_model(info.npz_path, expected_sha256="0" * 64)


def test_missing_artifact(tmp_path):
    with pytest.raises(ArtifactError):
        load_model(tmp_path / "nothing")


_FULL_DISK = """
import resource, signal, sys
import numpy as np
from app.core.mf.artifact import write_sealed
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # a disk that fills up after 4 KiB
try:
    write_sealed(sys.argv[1], {"x": np.arange(100_000, dtype=np.float64)}, {"format_version": 2})
except OSError:
    sys.exit(3)
"""


def test_a_failed_artifact_write_leaves_no_temporary_file(tmp_path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path / "model")], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
