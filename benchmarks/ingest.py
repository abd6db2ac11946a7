"""Ingest throughput on PostgreSQL: single-rating and 10,000-row batch upserts.

Rows measured (ratings/s):
* ``batch_insert_ratings_per_s``  – new ratings through the batch service (all-or-nothing
  validation, user upsert, ``INSERT .. ON CONFLICT .. RETURNING`` in 1,000-row statements), one
  transaction per 10,000-row batch, as the ``POST /ratings/batch`` route does.
* ``batch_update_ratings_per_s``  – the same batches again (every row an update).
* ``http_batch_ratings_per_s``    – the batch route in-process (JSON parsing, validation, auth).
* ``single_upsert_ratings_per_s`` – one rating per transaction (the ``PUT`` route's service).
Target: batch >= 50,000 ratings/s. Needs PostgreSQL at 127.0.0.1:5432 (``BENCH_PG_URL``).
"""

from __future__ import annotations

import os
import time
import uuid

import numpy as np

from benchmarks.harness import SuiteUnavailable, make_row

SUITE = "ingest"
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BATCH = 10_000


def _database() -> tuple[str, object]:
    from sqlalchemy import create_engine, text

    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        name = f"privrec_bench_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001
        raise SuiteUnavailable(f"PostgreSQL is not reachable ({exc.__class__.__name__})") from exc

    def drop() -> None:
        from app.db.session import dispose_engines

        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, drop


def _rows(n: int, n_users: int, n_items: int, seed: int) -> list[tuple[str, str, float]]:
    """``n`` distinct (user, item) pairs with ratings 0.5..5."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(n_users * n_items, size=n, replace=False)
    values = rng.integers(1, 11, size=n) / 2.0
    return [(f"user-{k // n_items}", f"item-{k % n_items}", float(v)) for k, v in zip(keys.tolist(), values.tolist())]


def run(quick: bool) -> list[dict]:
    from fastapi.testclient import TestClient

    from app.auth import issue_token
    from app.config import Settings
    from app.db.migrate import upgrade_head
    from app.db.session import get_sessionmaker
    from app.main import create_app
    from app.schemas.ingest import ItemIn, RatingRow
    from app.services import budget, ingest

    n_total = 50_000 if quick else 500_000
    n_users, n_items = (5_000, 2_000) if quick else (50_000, 10_000)
    n_single = 500 if quick else 3_000
    url, drop = _database()
    rows_out: list[dict] = []
    ds_label = f"synthetic-{n_users}u-{n_items}i"
    try:
        settings = Settings(database_url=url, redis_url=None, seed_demo=False, embedded_worker=False,
                            secret_key="bench-secret-0123456789abcdef-0123456789")
        upgrade_head(url)
        maker = get_sessionmaker(url)
        with maker() as s:
            budget.bootstrap(s, settings)
            for k in range(n_items):
                ingest.upsert_item(s, dataset="default", item_id=f"item-{k}", data=ItemIn(title=f"Item {k}"))
            s.commit()
        data = _rows(n_total, n_users, n_items, seed=1)
        batches = [[RatingRow(user_id=u, item_id=i, rating=v) for u, i, v in data[k:k + BATCH]]
                   for k in range(0, n_total, BATCH)]

        def batch_pass() -> float:
            t0 = time.perf_counter()
            for b in batches:
                with maker() as s:
                    ingest.upsert_ratings_batch(s, dataset="default", rows=b)
                    s.commit()
            return time.perf_counter() - t0

        for metric, seconds in (("batch_insert_ratings_per_s", batch_pass()),
                                ("batch_update_ratings_per_s", batch_pass())):
            rows_out.append(make_row(SUITE, ds_label, "postgresql", metric, n_total / seconds,
                                     baseline=50_000.0, seconds=seconds))

        app = create_app(settings)
        token = issue_token("bench", secret=settings.secret_key, kind="service", scopes=["ingest"])
        http_data = _rows(min(n_total, 100_000), n_users, n_items, seed=2)
        bodies = [{"ratings": [{"user_id": u, "item_id": i, "rating": v} for u, i, v in http_data[k:k + BATCH]]}
                  for k in range(0, len(http_data), BATCH)]
        with TestClient(app) as client:
            t0 = time.perf_counter()
            for body in bodies:
                r = client.post("/v1/datasets/default/ratings/batch", json=body,
                                headers={"Authorization": f"Bearer {token}"})
                assert r.status_code == 200, r.text[:300]
            seconds = time.perf_counter() - t0
        rows_out.append(make_row(SUITE, ds_label, "postgresql+http", "http_batch_ratings_per_s",
                                 len(http_data) / seconds, baseline=50_000.0, seconds=seconds))

        singles = _rows(n_single, n_users, n_items, seed=3)
        t0 = time.perf_counter()
        for u, i, v in singles:
            with maker() as s:
                ingest.upsert_rating(s, dataset="default", user_id=u, item_id=i, rating=v)
                s.commit()
        seconds = time.perf_counter() - t0
        rows_out.append(make_row(SUITE, ds_label, "postgresql", "single_upsert_ratings_per_s",
                                 n_single / seconds, seconds=seconds))
    finally:
        drop()
    return rows_out
