"""One contract for every store implementation: the PostgreSQL and SQLite stores of
:mod:`app.db.stores` run the same cases and must give the same outcomes.

The single-rating rules live in PL/pgSQL on PostgreSQL (migration 0009) and in statements on
SQLite; the cases below (new user, existing user, update, a user deleted before the write,
unknown data set or item, values at and beyond the range) pin them to one behaviour; the races
of PostgreSQL's concurrent writers and deletes are in ``tests/api/test_ingest_bulk.py``. The
driver-level pieces (binary COPY encoding, the COPY path, the pipelined check of a batch) are
tested here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.db.dialect import driver_connection
from app.db.migrate import upgrade_head
from app.db.models import utcnow
from app.db.session import dispose_engines, get_sessionmaker
from app.db.stores import DatasetRef, catalogue_store, ratings_postgres, ratings_store
from app.db.stores.catalogue import PostgresCatalogueStore, SqliteCatalogueStore
from app.db.stores.postgres_copy import pg_copy_ratings
from app.db.stores.ratings_postgres import PostgresRatingsStore
from app.db.stores.ratings_sqlite import SqliteRatingsStore
from app.errors import UnknownDataset
from app.services import budget, catalog

DS = "contract"
LOW, HIGH = 1.0, 5.0
ITEMS = [f"i{k}" for k in range(60)]
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)  # for writes that create only


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """A migrated database of each kind with the data set ``contract`` (range [1, 5], 60 items)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        upgrade_head(url)
    else:
        url = request.getfixturevalue("pg_url")
    make = get_sessionmaker(url)
    with make() as s:
        budget.ensure_dataset(s, DS, rating_min=LOW, rating_max=HIGH, epsilon_cap=10.0, delta=1e-6)
        catalog.import_items(s, dataset=DS, rows=[(i, None, []) for i in ITEMS])
        s.commit()
    try:
        yield make
    finally:
        dispose_engines()


def _count(make: sessionmaker[Session], table: str) -> int:
    with make() as s:
        return int(s.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _version(make: sessionmaker[Session]) -> int:
    with make() as s:
        return int(catalogue_store(s).get_dataset(DS).ratings_version)


def _one(make: sessionmaker[Session], user: str, item: str, value: float, dataset: str = DS):
    with make() as s:
        out = ratings_store(s).upsert_one(dataset, user, item, value, utcnow())  # each write its own time, as in service
        s.commit()
    return out


# ------------------------------------------------------------------ the store picked by dialect
def test_the_dialect_picks_the_implementation(db: sessionmaker[Session]) -> None:
    with db() as s:
        pg = s.get_bind().dialect.name == "postgresql"
        assert isinstance(ratings_store(s), PostgresRatingsStore if pg else SqliteRatingsStore)
        assert isinstance(catalogue_store(s), PostgresCatalogueStore if pg else SqliteCatalogueStore)


# ------------------------------------------------------------------ one rating: the rules
def test_one_rating_new_user_then_update(db: sessionmaker[Session]) -> None:
    v0 = _version(db)
    first = _one(db, "alice", "i1", 3.0)
    assert first is not None and (first.rating_min, first.rating_max, first.inserted) == (LOW, HIGH, True)
    assert first.item_id is not None and first.user_id is not None
    again = _one(db, "alice", "i1", 4.0)
    assert again is not None and again.inserted is False and again.user_id == first.user_id
    assert _one(db, "alice", "i2", 2.0).inserted is True  # type: ignore[union-attr]  # existing user, new rating
    assert _count(db, "users") == 1 and _count(db, "ratings") == 2
    assert _version(db) == v0 + 3
    with db() as s:
        assert sorted(zip(*ratings_store(s).user_ratings(catalogue_store(s).get_dataset(DS).id, "alice"),
                          strict=True)) == [("i1", 4.0), ("i2", 2.0)]


def test_one_rating_unknown_data_set_writes_nothing(db: sessionmaker[Session]) -> None:
    assert _one(db, "bob", "i1", 3.0, dataset="nope") is None
    assert _count(db, "users") == 0 and _count(db, "ratings") == 0


@pytest.mark.parametrize("value", [LOW - 0.5, HIGH + 0.5, math.inf, -math.inf, math.nan])
def test_one_rating_out_of_range_writes_nothing_and_creates_no_user(db: sessionmaker[Session], value: float) -> None:
    v0 = _version(db)
    out = _one(db, "carol", "i1", value)
    assert out is not None and (out.rating_min, out.rating_max) == (LOW, HIGH)
    assert out.item_id is not None and out.user_id is None and out.inserted is None
    assert _count(db, "users") == 0 and _count(db, "ratings") == 0 and _version(db) == v0


@pytest.mark.parametrize("value", [LOW, HIGH])
def test_one_rating_at_the_range_s_ends_is_written(db: sessionmaker[Session], value: float) -> None:
    assert _one(db, "dan", "i1", value).inserted is True  # type: ignore[union-attr]


def test_one_rating_unknown_item_writes_nothing(db: sessionmaker[Session]) -> None:
    out = _one(db, "erin", "ghost", 3.0)
    assert out is not None and out.item_id is None and out.user_id is None and out.inserted is None
    _one(db, "erin", "i1", 3.0)
    out = _one(db, "erin", "ghost", 3.0)  # an existing user is found, still nothing written
    assert out is not None and out.item_id is None and out.user_id is not None and out.inserted is None
    assert _count(db, "ratings") == 1


def test_one_rating_after_the_user_was_deleted_creates_them_again(db: sessionmaker[Session]) -> None:
    _one(db, "fay", "i1", 3.0)
    with db() as s:
        assert ratings_store(s).delete_user("fay") == 1
        s.commit()
    again = _one(db, "fay", "i1", 4.0)
    assert again is not None and again.inserted is True and again.user_id is not None
    assert _count(db, "users") == 1 and _count(db, "ratings") == 1


# ------------------------------------------------------------------ batches
def _batch(make: sessionmaker[Session], users: list[str], items: list[str], values: list[float]):
    with make() as s:
        store = ratings_store(s)
        ds = store.start_rating_write(DS)
        iids = store.item_ids(ds, items)
        checks: list[bool] = []
        now = utcnow()  # each write its own time, as in service
        uids = store.user_ids(users, now, lambda: checks.append(True))
        created = store.write_ratings(ds, uids, iids, np.asarray(values, dtype=np.float64), now)  # type: ignore[arg-type]
        s.commit()
    assert checks == [True]
    pairs = set(zip(uids, iids, strict=True))
    return pairs if created is None else created, pairs


@pytest.mark.parametrize("n_users", [2, 40])  # 4 rows (one statement), 80 rows (PostgreSQL: COPY, staged upsert)
def test_a_batch_creates_then_updates_and_bumps_the_version_by_its_rows(db: sessionmaker[Session], n_users: int) -> None:
    v0 = _version(db)
    users = [f"u{k}" for k in range(n_users) for _ in range(2)]
    items = [f"i{j}" for _ in range(n_users) for j in range(2)]
    created, pairs = _batch(db, users, items, [2.0] * len(users))
    assert created == pairs
    more_users = users + [f"new{k}" for k in range(n_users)]
    more_items = items + ["i9"] * n_users
    created, pairs = _batch(db, more_users, more_items, [4.0] * len(more_users))
    assert len(created) == n_users and created < pairs  # the new users' ratings only
    assert _count(db, "ratings") == 3 * n_users and _count(db, "users") == 2 * n_users
    assert _version(db) == v0 + 5 * n_users
    with db() as s:
        ds_id = catalogue_store(s).get_dataset(DS).id
        u, i, v = ratings_store(s).triplets("ratings", ds_id)
    assert len(u) == len(i) == 3 * n_users and set(v.tolist()) == {4.0}


def test_a_batch_s_unknown_data_set_and_items(db: sessionmaker[Session]) -> None:
    with db() as s:
        store = ratings_store(s)
        with pytest.raises(UnknownDataset):
            store.start_rating_write("nope")
    with db() as s:
        store = ratings_store(s)
        ds = store.start_rating_write(DS)
        ids = store.item_ids(ds, ["i3", "ghost", "i3"])
        assert ids[0] is not None and ids[0] == ids[2] and ids[1] is None


def test_a_failing_check_keeps_no_user(db: sessionmaker[Session]) -> None:
    """``check_rows`` runs once; where it raises, no user is kept even if the caller commits."""

    def refuse() -> None:
        raise ValueError("invalid rows")

    with db() as s:
        store = ratings_store(s)
        store.start_rating_write(DS)
        with pytest.raises(ValueError, match="invalid rows"):
            store.user_ids(["x1", "x2"], NOW, refuse)
        s.commit()
    assert _count(db, "users") == 0


@pytest.mark.integration
def test_postgres_checks_a_batch_while_it_inserts_the_new_users(db: sessionmaker[Session]) -> None:
    """PostgreSQL: ``check_rows`` runs while the users' INSERT is in flight (a pipeline)."""
    with db() as s:
        if s.get_bind().dialect.name != "postgresql":
            pytest.skip("the pipelined users insert is PostgreSQL's")
        ratings_postgres.NEW_USERS_FIRST.reset()
        store = ratings_store(s)
        store.start_rating_write(DS)
        conn = driver_connection(s)
        in_pipeline: list[bool] = []
        store.user_ids(["p1", "p2"], NOW, lambda: in_pipeline.append(conn.info.pipeline_status.name != "OFF"))
        s.rollback()
    assert in_pipeline == [True]


@pytest.mark.integration
def test_postgres_copies_an_all_new_batch_and_works_while_the_rows_go_in(db: sessionmaker[Session]) -> None:
    """PostgreSQL: a batch of new ratings is one COPY (every row created: None), with the
    client's ``while_copying`` run while the COPY is open; a batch meeting an existing rating
    goes through the staged upsert (the pairs created come back)."""
    with db() as s:
        if s.get_bind().dialect.name != "postgresql":
            pytest.skip("COPY is PostgreSQL's")
    ratings_postgres.PLAIN_INSERT_FIRST.reset()
    during: list[str] = []

    def write(users: list[str]) -> set[tuple[int, int]] | None:
        with db() as s:
            store = ratings_store(s)
            ds = store.start_rating_write(DS)
            iids = store.item_ids(ds, ITEMS)
            uid_of = dict(zip(users, store.user_ids(users, NOW, lambda: None), strict=True))
            uids = [uid_of[u] for u in users for _ in ITEMS]
            conn = driver_connection(s)
            out = store.write_ratings(ds, uids, iids * len(users), np.full(len(uids), 3.0), utcnow(),
                                      lambda: during.append(conn.info.transaction_status.name))
            s.commit()
        return out

    assert write(["c1", "c2"]) is None
    assert during == ["ACTIVE"]  # a command (the COPY) in progress
    created = write(["c2", "c3"])
    assert created is not None and len(created) == len(ITEMS)  # c3's ratings only
    assert _count(db, "ratings") == 3 * len(ITEMS)


# ------------------------------------------------------------------ users, deletes, reads
def test_ensure_users_is_idempotent(db: sessionmaker[Session]) -> None:
    with db() as s:
        first = ratings_store(s).ensure_users(["b", "a", "b"], NOW)
        s.commit()
    with db() as s:
        again = ratings_store(s).ensure_users(["a", "c"], NOW)
        s.commit()
    assert sorted(again) == ["a", "c"] and again["a"] == first["a"] and again["c"] not in first.values()
    assert sorted(first) == ["a", "b"] and _count(db, "users") == 3


def test_delete_rating_and_user(db: sessionmaker[Session]) -> None:
    for item in ("i1", "i2", "i3"):
        _one(db, "gus", item, 3.0)
    v0 = _version(db)
    with db() as s:
        store, ds_id = ratings_store(s), catalogue_store(s).get_dataset(DS).id
        assert store.delete_rating(ds_id, "gus", "i1") == 1
        assert store.delete_rating(ds_id, "gus", "i1") == 0
        assert store.delete_rating(ds_id, "nobody", "i2") == 0 and store.delete_rating(ds_id, "gus", "ghost") == 0
        total, page = store.user_ratings_page(ds_id, "gus", 1, 5)
        assert total == 2 and [(e, v) for e, v, _ in page] == [("i3", 3.0)]
        assert store.delete_user("nobody") is None
        assert store.delete_user("gus") == 2
        s.commit()
    assert _count(db, "users") == 0 and _count(db, "ratings") == 0 and _version(db) == v0 + 3


# ------------------------------------------------------------------ catalogue
def test_catalogue_store(db: sessionmaker[Session]) -> None:
    with db() as s:
        store = catalogue_store(s)
        ds = store.get_dataset(DS)
        assert store.find_dataset("nope") is None and store.find_dataset(DS, lock="share") is ds
        with pytest.raises(UnknownDataset):
            store.get_dataset("nope", lock="update")
        assert store.dataset_ref(DS) == DatasetRef(ds.id, DS, LOW, HIGH) and store.rating_range(ds.id) == (LOW, HIGH)
        ids = store.item_row_ids(ds.id, ["i2", "ghost", "i1", "i2"])
        assert sorted(ids) == ["i1", "i2"]
        db_ids, ext = store.item_index(ds.id)
        assert len(db_ids) == len(ITEMS) and list(db_ids) == sorted(db_ids) and ids["i1"] in db_ids.tolist()
        assert set(ext.tolist()) == set(ITEMS)
        store.upsert_item(ds.id, "new", {"title": "T", "categories": ["c"], "features": {"f": 1.0}, "active": False,
                                         "updated_at": NOW}, NOW)
        store.upsert_items(ds.id, {"i1": ("one", ["c", "d"])}, NOW)
        s.commit()
    with db() as s:
        store = catalogue_store(s)
        ds_id = store.get_dataset(DS).id
        facts = store.item_facts(ds_id, "new")
        assert facts is not None and (facts.categories, facts.features) == (["c"], {"f": 1.0})
        assert store.item_facts(ds_id, "ghost") is None and store.get_item(ds_id, "ghost") is None
        assert store.get_item(ds_id, "i1").title == "one"  # type: ignore[union-attr]
        total, page = store.items_page(ds_id, 0, 3)
        assert total == len(ITEMS) + 1 and [i.external_id for i in page] == ["i0", "i1", "i10"]
        assert sorted((e, list(c), bool(a)) for e, c, a in store.items_carrying_a_fact(ds_id)) == \
            [("i1", ["c", "d"], True), ("new", ["c"], False)]
        assert len(list(store.model_item_rows(ds_id))) == len(ITEMS) + 1


# ------------------------------------------------------------------ driver-level encodings
def test_binary_copy_rows_encode_every_field() -> None:
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
