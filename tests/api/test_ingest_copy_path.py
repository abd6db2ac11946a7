"""Bulk ingest's write paths (issue 13): a batch of new ratings is one COPY straight into
``ratings``; a batch meeting existing ratings falls back to the staged upsert with the same
outcome; rows are written in (user, item) key order whatever the id sizes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from sqlalchemy import text

from app.db.dialect import pg_copy_ratings
from app.schemas.ingest import RatingRow
from app.services import ingest
from tests.api.conftest import Env, add_items

N_ITEMS = 20


def _rows(users: range, value: float) -> list[RatingRow]:
    return [RatingRow(user_id=f"u{k}", item_id=f"i{j}", rating=value) for k in users for j in range(N_ITEMS)]


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The COPY statements psycopg runs (the target table of each)."""
    seen: list[str] = []
    original = psycopg.Cursor.copy

    @contextlib.contextmanager
    def spy(self: psycopg.Cursor, statement: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        seen.append(str(statement).split()[1])
        with original(self, statement, *args, **kwargs) as copy:
            yield copy

    monkeypatch.setattr(psycopg.Cursor, "copy", spy)
    monkeypatch.setattr(ingest, "_PLAIN_INSERT_FIRST", ingest._PlainInsertFirst())
    return seen


@pytest.mark.integration
def test_new_ratings_are_copied_into_ratings_and_existing_ones_upserted(env: Env, copies: list[str]) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("COPY is PostgreSQL's")
    add_items(env, N_ITEMS)
    with env.session() as s:
        out = ingest.upsert_ratings_batch(s, dataset="default", rows=_rows(range(5), 2.0))
        s.commit()
    assert (out.created, out.updated) == (100, 0) and copies == ["ratings"]
    copies.clear()
    with env.session() as s:  # users 3..7: 40 existing ratings, 60 new
        out = ingest.upsert_ratings_batch(s, dataset="default", rows=_rows(range(3, 8), 4.5))
        s.commit()
    assert copies == ["ratings", "ingest_rating_stage"]  # the COPY met an existing key: staged upsert
    assert (out.created, out.updated) == (60, 40)
    assert [r["status"] for r in out.results] == ["updated"] * 40 + ["created"] * 60
    with env.session() as s:
        stored = s.execute(text(
            "SELECT u.external_id, count(*), min(r.value), max(r.value), bool_and(r.created_at <= r.updated_at) "
            "FROM ratings r JOIN users u ON u.id = r.user_id GROUP BY u.external_id ORDER BY 1")).all()
    assert [tuple(row) for row in stored] == [(f"u{k}", N_ITEMS, 2.0 if k < 3 else 4.5, 2.0 if k < 3 else 4.5, True)
                                              for k in range(8)]


def test_key_order_is_user_then_item_for_small_and_huge_ids() -> None:
    rng = np.random.default_rng(0)
    for high in (1_000, 2**31 - 1, 2**40):
        u, i = rng.integers(0, high, 500), rng.integers(0, high, 500)
        order = ingest._key_order(u, i)
        assert [(a, b) for a, b in zip(u[order].tolist(), i[order].tolist(), strict=True)] == \
            sorted(zip(u.tolist(), i.tolist(), strict=True))


def test_binary_copy_rows_encode_every_field() -> None:
    from datetime import UTC, datetime

    data = pg_copy_ratings(7, np.array([1, 2**40]), np.array([3, 4]), np.array([0.5, 5.0]),
                           datetime(2000, 1, 1, 0, 0, 1, 5, tzinfo=UTC))
    layout = np.dtype([("n", ">i2"), ("l0", ">i4"), ("ds", ">i4"), ("l1", ">i4"), ("u", ">i8"), ("l2", ">i4"),
                       ("i", ">i8"), ("l3", ">i4"), ("v", ">f8"), ("l4", ">i4"), ("c", ">i8"), ("l5", ">i4"),
                       ("t", ">i8")])
    assert data[:19] == b"PGCOPY\n\xff\r\n\x00" + bytes(8) and len(data) == 19 + 2 * layout.itemsize + 2
    row = np.frombuffer(data[19:-2], dtype=layout)
    assert row["l0"].tolist() == [4, 4] and {row[f"l{k}"][0] for k in range(1, 6)} == {8}
    assert row["n"].tolist() == [6, 6] and row["ds"].tolist() == [7, 7] and row["u"].tolist() == [1, 2**40]
    assert row["i"].tolist() == [3, 4] and row["v"].tolist() == [0.5, 5.0]
    assert row["c"].tolist() == row["t"].tolist() == [1_000_005, 1_000_005]
    assert data[-2:] == b"\xff\xff"


@pytest.mark.integration
def test_a_batch_builds_its_results_while_the_copy_runs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The all-created results are built while PostgreSQL inserts the COPY's rows; they are the
    batch's results only where every row was created."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("COPY is PostgreSQL's")
    monkeypatch.setattr(ingest, "_PLAIN_INSERT_FIRST", ingest._PlainInsertFirst())
    add_items(env, N_ITEMS)
    copying = [False]
    built: list[bool] = []  # per build of the results: whether a COPY was open
    original_copy, original_results = psycopg.Cursor.copy, ingest._row_results

    @contextlib.contextmanager
    def copy(self: psycopg.Cursor, statement: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with original_copy(self, statement, *args, **kwargs) as cp:
            copying[0] = True
            try:
                yield cp
            finally:
                copying[0] = False

    def results(*args: Any) -> Any:
        built.append(copying[0])
        return original_results(*args)

    monkeypatch.setattr(psycopg.Cursor, "copy", copy)
    monkeypatch.setattr(ingest, "_row_results", results)
    rows = _rows(range(5), 2.0)
    with env.session() as s:
        out = ingest.upsert_ratings_batch(s, dataset="default", rows=rows)
        s.commit()
    assert built == [True]  # once, during the COPY
    assert out.results == [{"index": k, "user_id": r.user_id, "item_id": r.item_id, "status": "created", "error": None}
                           for k, r in enumerate(rows)]
    built.clear()
    with env.session() as s:  # users 3..7: the COPY fails, the staged upsert reports per row
        out = ingest.upsert_ratings_batch(s, dataset="default", rows=_rows(range(3, 8), 4.5))
        s.commit()
    assert built == [True, False]  # built during the failed COPY, and again after the upsert: those hold
    assert [r["status"] for r in out.results] == ["updated"] * 40 + ["created"] * 60


class _SameHash(str):
    """A user id whose hash collides with every other one's."""

    def __hash__(self) -> int:
        return 7


def test_repeated_pairs_are_found_by_key_and_colliding_keys_are_checked_row_by_row() -> None:
    from app.services.catalog import DatasetRef

    ds = DatasetRef(1, "default", 0.5, 5.0)
    values = np.full(3, 3.0)
    assert ingest._pairs_distinct(["a", "b", "a"], [1, 1, 2])
    assert not ingest._pairs_distinct(["a", "b", "a"], [1, 1, 1])
    errors = ingest._row_errors(ds, ["a", "b", "a"], ["x", "x", "x"], values, [1, 1, 1])
    assert [(e.index, e.error) for e in errors] == [(2, "duplicate (user, item) pair; first at row 0")]
    colliding = [_SameHash("a"), _SameHash("b"), _SameHash("c")]
    assert not ingest._pairs_distinct(colliding, [1, 1, 1])  # distinct pairs, one key: checked row by row
    assert ingest._row_errors(ds, colliding, ["x", "x", "x"], values, [1, 1, 1]) == []
