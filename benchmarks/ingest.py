"""Ingest throughput on PostgreSQL: single-rating and 10,000-row batch upserts.

Rows measured (ratings/s):
* ``batch_insert_ratings_per_s``  – new ratings through the batch service (all-or-nothing
  validation, user upsert, the rows' upsert), one transaction per 10,000-row batch, as the
  ``POST /ratings/batch`` route does. Baseline: the same-run COPY ceiling below.
* ``batch_update_ratings_per_s``  – the same batches again (every row an update).
* ``copy_ceiling_ratings_per_s``  – a plain ``COPY`` of the same rows (row ids resolved, same
  columns) into an unconstrained, unindexed table, one transaction per 10,000 rows: what
  PostgreSQL's bulk path alone allows on this machine in this run.
* ``http_batch_ratings_per_s``    – the batch route in-process (JSON parsing, validation, auth).
* ``single_upsert_ratings_per_s`` – one rating per transaction (the ``PUT`` route's service),
  ``SINGLE_CLIENTS`` concurrent clients (threads, one session each).
Targets: service >= 100,000 and >= 50 % of the COPY ceiling, HTTP >= 50,000,
single >= 2,000 with 16 clients. Needs PostgreSQL at 127.0.0.1:5432 (``BENCH_PG_URL``).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import numpy as np

from benchmarks.harness import SuiteUnavailable, make_row

SUITE = "ingest"
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BATCH = 10_000
SINGLE_CLIENTS = 16


def _database() -> tuple[str, Callable[[], None]]:
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
    return [(f"user-{k // n_items}", f"item-{k % n_items}", float(v))
            for k, v in zip(keys.tolist(), values.tolist(), strict=True)]


def _copy_ceiling(url: str, batches: list[list[tuple[int, int, float]]], dataset_id: int) -> float:
    """Seconds to COPY ``batches`` of (user row id, item row id, value) into an unconstrained table."""
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE copy_ceiling (dataset_id int, user_id bigint, item_id bigint, value float8, "
                     "created_at timestamptz, updated_at timestamptz)")
        conn.commit()
        t0 = time.perf_counter()
        for batch in batches:
            (now_row,) = conn.execute("SELECT now()").fetchall()  # exactly one row
            now = now_row[0].isoformat()
            block = "".join(f"{dataset_id}\t{u}\t{i}\t{v!r}\t{now}\t{now}\n" for u, i, v in batch)
            with conn.cursor().copy("COPY copy_ceiling FROM STDIN") as copy:
                copy.write(block)
            conn.commit()
        return time.perf_counter() - t0


def _concurrent_singles(maker, rows: list[tuple[str, str, float]], clients: int) -> float:
    """Seconds for ``clients`` threads to upsert ``rows`` one per transaction (a session each)."""
    import threading

    from app.services import ingest

    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client(part: list[tuple[str, str, float]]) -> None:
        barrier.wait()
        try:
            for u, i, v in part:
                with maker() as s:
                    ingest.upsert_rating(s, dataset="default", user_id=u, item_id=i, rating=v)
                    s.commit()
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(rows[k::clients],)) for k in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def run(quick: bool) -> list[dict]:
    from fastapi.testclient import TestClient
    from sqlalchemy import select

    from app.auth import issue_token
    from app.config import Settings
    from app.db.migrate import upgrade_head
    from app.db.models import Item, User
    from app.db.session import engine_options, get_sessionmaker
    from app.main import create_app
    from app.schemas.ingest import ItemIn, RatingRow
    from app.services import budget, catalog, ingest

    n_total = 50_000 if quick else 500_000
    n_users, n_items = (5_000, 2_000) if quick else (50_000, 10_000)
    n_single = 1_000 if quick else 6_000
    url, drop = _database()
    rows_out: list[dict] = []
    ds_label = f"synthetic-{n_users}u-{n_items}i"
    try:
        settings = Settings(database_url=url, redis_url=None, seed_demo=False, embedded_worker=False,
                            secret_key="bench-secret-0123456789abcdef-0123456789",
                            db_pool_size=max(10, SINGLE_CLIENTS))
        upgrade_head(url)
        maker = get_sessionmaker(url, engine_options(settings))  # 16 clients: pool from the settings
        with maker() as s:
            budget.bootstrap(s, settings)
            for k in range(n_items):
                catalog.upsert_item(s, dataset="default", item_id=f"item-{k}", data=ItemIn(title=f"Item {k}"))
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

        insert_seconds, update_seconds = batch_pass(), batch_pass()
        with maker() as s:
            user_ids = dict(s.execute(select(User.external_id, User.id)).all())
            item_ids = dict(s.execute(select(Item.external_id, Item.id)).all())
            dataset_id = catalog.get_dataset(s, "default").id
        resolved = [(user_ids[u], item_ids[i], v) for u, i, v in data]
        copy_seconds = _copy_ceiling(url, [resolved[k:k + BATCH] for k in range(0, n_total, BATCH)], dataset_id)
        copy_rate = n_total / copy_seconds
        rows_out.append(make_row(SUITE, ds_label, "postgresql", "copy_ceiling_ratings_per_s", copy_rate,
                                 seconds=copy_seconds))
        for metric, seconds in (("batch_insert_ratings_per_s", insert_seconds),
                                ("batch_update_ratings_per_s", update_seconds)):
            rows_out.append(make_row(SUITE, ds_label, "postgresql", metric, n_total / seconds,
                                     baseline=copy_rate, seconds=seconds))

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

        seconds = _concurrent_singles(maker, _rows(n_single, n_users, n_items, seed=3), SINGLE_CLIENTS)
        rows_out.append(make_row(SUITE, f"{ds_label}-{SINGLE_CLIENTS}-clients", "postgresql",
                                 "single_upsert_ratings_per_s", n_single / seconds, baseline=2_000.0, seconds=seconds))
    finally:
        drop()
    return rows_out
