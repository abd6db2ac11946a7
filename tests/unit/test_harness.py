"""Benchmark harness: a tiny fake suite through the CLI, row validation, helpers."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from benchmarks import harness as H

FAKE = "tests_fake_suite_module"


@pytest.fixture()
def fake_suite(monkeypatch):
    mod = types.ModuleType(FAKE)
    mod.SUITE = "fake"

    def run(quick: bool) -> list[dict]:
        n = 2 if quick else 3
        return [
            H.make_row("fake", "toy", "als", "rmse", 0.8, seeds=[0, 1, 2][:n], std=0.01, seconds=0.1),
            H.make_row("fake", "toy", "dpals", "rmse", 0.9, epsilon=1.0, delta=1e-5, seeds=n, baseline=0.8),
        ]

    mod.run = run
    monkeypatch.setitem(sys.modules, FAKE, mod)
    return {"fake": FAKE, "missing": "benchmarks.no_such_suite_module"}


def test_cli_runs_fake_suite_and_writes_json(fake_suite, tmp_path, capsys):
    out = tmp_path / "res" / "fake.json"
    assert H.main(["fake", "--quick", "--json", str(out), "--threads", "1"], registry=fake_suite) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[1].split()
    assert header == list(H.ROW_KEYS)
    assert "dpals" in printed and "1.125" in printed  # ratio 0.9 / 0.8
    doc = json.loads(out.read_text())
    assert doc["suite"] == "fake" and doc["quick"] is True
    assert doc["machine"]["cpu_count"] >= 1 and doc["machine"]["thread_limit"] == 1
    assert len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert set(row) == set(H.ROW_KEYS)
    assert doc["rows"][1]["ratio"] == pytest.approx(0.9 / 0.8)
    assert doc["rows"][0]["seeds"] == [0, 1] and doc["rows"][1]["seeds"] == 2
    assert doc["rows"][0]["epsilon"] is None and doc["rows"][0]["ratio"] is None


def test_missing_and_unknown_suites_give_clear_errors(fake_suite, capsys):
    assert H.main(["missing"], registry=fake_suite) == 2
    assert "does not exist yet" in capsys.readouterr().err
    assert H.main(["nope"], registry=fake_suite) == 2
    assert "unknown suite" in capsys.readouterr().err
    with pytest.raises(H.SuiteUnavailable):
        H.load_suite("missing", fake_suite)


def test_list_shows_registered_suites(capsys):
    assert H.main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name in ("quality-synthetic", "quality-ml1m", "speed-train", "ingest", "serve"):
        assert name in listed
    assert H.SUITES["speed-train"] == "benchmarks.speed_train"


def test_suite_with_wrong_label_is_rejected(fake_suite, monkeypatch):
    monkeypatch.setattr(sys.modules[FAKE], "SUITE", "other")
    with pytest.raises(H.SuiteUnavailable, match="SUITE"):
        H.load_suite("fake", fake_suite)


@pytest.mark.parametrize(
    "change",
    [
        {"value": float("nan")},
        {"value": None},
        {"epsilon": 0.0},
        {"delta": 1.5},
        {"seeds": 0},
        {"seeds": True},
        {"dataset": ""},
        {"extra": 1},
    ],
)
def test_validate_row_rejects_bad_rows(change):
    row = H.make_row("s", "d", "a", "m", 1.0)
    row.update(change)
    with pytest.raises(ValueError):
        H.validate_row(row)


def test_make_row_ratio_and_missing_key():
    assert H.make_row("s", "d", "a", "m", 3.0, baseline=2.0)["ratio"] == 1.5
    assert H.make_row("s", "d", "a", "m", 3.0, baseline=0.0)["ratio"] is None
    row = H.make_row("s", "d", "a", "m", 1.0)
    del row["std"]
    with pytest.raises(ValueError, match="missing"):
        H.validate_row(row)


def test_limit_threads_and_peak_memory():
    from threadpoolctl import threadpool_info

    with H.limit_threads(1):
        assert all(p["num_threads"] == 1 for p in threadpool_info())
    with H.peak_memory(trace_python=True) as mem:
        block = np.ones(64 * 2**20 // 8)  # 64 MiB
        block.sum()
        del block
    assert mem.traced_peak_mib is not None and mem.traced_peak_mib >= 60
    assert mem.rss_peak_mib >= mem.rss_before_mib
    with pytest.raises(ValueError), H.limit_threads(0):
        pass


def test_mean_std():
    assert H.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert H.mean_std([4.0]) == (4.0, None)
    with pytest.raises(ValueError):
        H.mean_std([])
