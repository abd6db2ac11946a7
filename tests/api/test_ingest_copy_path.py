"""Bulk ingest's write paths: a batch of new ratings and a batch meeting existing ratings give
per-row outcomes (on PostgreSQL: one COPY straight into ``ratings``, and the staged upsert);
rows are written in (user, item) key order whatever the id sizes."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from app.db.stores import ratings_postgres
from app.schemas.ingest import RatingRow
from app.services import ingest
from tests.api.conftest import Env, add_items

N_ITEMS = 20


def _rows(users: range, value: float) -> list[RatingRow]:
    return [RatingRow(user_id=f"u{k}", item_id=f"i{j}", rating=value) for k in users for j in range(N_ITEMS)]


def test_new_ratings_are_created_and_existing_ones_updated_row_by_row(env: Env) -> None:
    """On PostgreSQL the first batch is one COPY into ``ratings`` and the second falls back to the
    staged upsert (the store contract tells the paths apart); the outcome is the same on both."""
    ratings_postgres.PLAIN_INSERT_FIRST.reset()
    add_items(env, N_ITEMS)
    with env.session() as s:
        out = ingest.upsert_ratings_batch(s, dataset="default", rows=_rows(range(5), 2.0))
        s.commit()
    assert (out.created, out.updated) == (100, 0)
    assert {r["status"] for r in out.results} == {"created"}
    with env.session() as s:  # users 3..7: 40 existing ratings, 60 new
        out = ingest.upsert_ratings_batch(s, dataset="default", rows=_rows(range(3, 8), 4.5))
        s.commit()
    assert (out.created, out.updated) == (60, 40)
    assert [r["status"] for r in out.results] == ["updated"] * 40 + ["created"] * 60
    with env.session() as s:
        stored = s.execute(text(
            "SELECT u.external_id, count(*), min(r.value), max(r.value), "
            "min(CASE WHEN r.created_at <= r.updated_at THEN 1 ELSE 0 END) "
            "FROM ratings r JOIN users u ON u.id = r.user_id GROUP BY u.external_id ORDER BY 1")).all()
    assert [tuple(row) for row in stored] == [(f"u{k}", N_ITEMS, 2.0 if k < 3 else 4.5, 2.0 if k < 3 else 4.5, 1)
                                              for k in range(8)]


def test_key_order_is_user_then_item_for_small_and_huge_ids() -> None:
    rng = np.random.default_rng(0)
    for high in (1_000, 2**31 - 1, 2**40):
        u, i = rng.integers(0, high, 500), rng.integers(0, high, 500)
        order = ratings_postgres.key_order(u, i)
        assert [(a, b) for a, b in zip(u[order].tolist(), i[order].tolist(), strict=True)] == \
            sorted(zip(u.tolist(), i.tolist(), strict=True))


class _SameHash(str):
    """A user id whose hash collides with every other one's."""

    def __hash__(self) -> int:
        return 7


def test_repeated_pairs_are_found_by_key_and_colliding_keys_are_checked_row_by_row() -> None:
    from app.db.stores import DatasetRef

    ds = DatasetRef(1, "default", 0.5, 5.0)
    values = np.full(3, 3.0)
    assert ingest._pairs_distinct(["a", "b", "a"], [1, 1, 2])
    assert not ingest._pairs_distinct(["a", "b", "a"], [1, 1, 1])
    errors = ingest._row_errors(ds, ["a", "b", "a"], ["x", "x", "x"], values, [1, 1, 1])
    assert [(e.index, e.error) for e in errors] == [(2, "duplicate (user, item) pair; first at row 0")]
    colliding = [_SameHash("a"), _SameHash("b"), _SameHash("c")]
    assert not ingest._pairs_distinct(colliding, [1, 1, 1])  # distinct pairs, one key: checked row by row
    assert ingest._row_errors(ds, colliding, ["x", "x", "x"], values, [1, 1, 1]) == []
