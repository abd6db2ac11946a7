"""Noise seeds: drawn from ``secrets`` with at least 128 bits, and every registered algorithm's core
uses all of them (numpy's SeedSequence takes arbitrarily large integers)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.algorithms import ALGORITHMS, get_algorithm
from tests.unit.test_algorithm_contract import CASES, DELTA, EPSILON, RANGE

ROOT = Path(__file__).resolve().parents[2]
SEED_BITS = 128
BIG_SEED = (1 << 127) + 12345


def _randbits_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for path in [*(ROOT / "app").rglob("*.py"), *(ROOT / "workers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "randbits":
                calls.append((path, node))
    return calls


def test_every_secret_seed_has_at_least_128_bits():
    """Every ``secrets.randbits`` draw in the service (the training worker's noise seed, the votes'
    randomisation) asks for >= 128 bits as a literal."""
    calls = _randbits_calls()
    assert any(path.name == "runner.py" for path, _ in calls)  # the training seed is drawn this way
    for path, call in calls:
        (bits,) = call.args
        assert isinstance(bits, ast.Constant) and isinstance(bits.value, int), path
        assert bits.value >= SEED_BITS, f"{path}: randbits({bits.value})"


def _model(algorithm: str, seed: int) -> Any:
    """A small run with ``seed``, the config re-read as the training worker does."""
    algo, case = get_algorithm(algorithm), CASES[algorithm]
    base = algo.config_from_params(dict(case.params), RANGE)
    config = algo.calibrate(EPSILON[algorithm], DELTA, base, case.data.n_items)
    config = algo.config_from_dict({**algo.public_config(config), "seed": seed})
    return algo.train(case.data, config, **case.inputs)


def _published(algorithm: str, seed: int) -> np.ndarray:
    return np.asarray(_model(algorithm, seed).item_factors)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_core_uses_every_bit_of_a_128_bit_seed(algorithm):
    """The same 128-bit seed gives the same run; seeds that differ only above bit 64 give other noise."""
    first = _published(algorithm, BIG_SEED)
    np.testing.assert_array_equal(first, _published(algorithm, BIG_SEED))
    assert not np.array_equal(first, _published(algorithm, BIG_SEED + (1 << 100)))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_seed_is_in_no_published_byte(algorithm, tmp_path):
    """The sealed artifact (arrays, config, metadata) carries neither the seed nor its digits."""
    model = _model(algorithm, BIG_SEED)
    assert "seed" not in model.config
    get_algorithm(algorithm).save(model, tmp_path / "model")
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert str(BIG_SEED).encode() not in data and BIG_SEED.to_bytes(16, "little") not in data, path
