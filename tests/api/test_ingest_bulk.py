"""Bulk ingest: the COPY-staged upsert keeps the batch semantics; no orphan ratings
when users are deleted while their ratings are being written (the ratings table has no foreign
keys; the service checks and locks references set-based)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from app.db.models import Dataset
from app.db.reference_ids import reference_ids
from app.db.stores import ratings_postgres
from app.schemas.ingest import RatingBatchResult, RatingRow
from app.services import ingest
from tests.api.conftest import Env, add_items

R = "/v1/datasets/default"
N_ITEMS = 40


def _batch(users: list[str], items: range, value) -> dict:
    return {"ratings": [{"user_id": u, "item_id": f"i{i}", "rating": value(k)}
                        for k, (u, i) in enumerate((u, i) for u in users for i in items)]}


def _version(env: Env) -> int:
    with env.session() as s:
        return s.query(Dataset).filter_by(name="default").one().ratings_version


def test_large_batches_report_created_then_updated_and_store_every_value(env: Env) -> None:
    add_items(env, N_ITEMS)
    users = [f"u{k}" for k in range(10)]
    body = _batch(users, range(0, 30), lambda k: 1.0 + (k % 9) / 2)  # 300 rows: the staged path
    v0 = _version(env)
    r = env.client.post(f"{R}/ratings/batch", json=body, headers=env.ingest_service)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["created"] == 300 and out["updated"] == 0
    assert [row["index"] for row in out["results"]] == list(range(300))
    assert {row["status"] for row in out["results"]} == {"created"}
    assert _version(env) == v0 + 300
    # overlapping batch: items 20-39, the first 10 of them already rated
    body2 = _batch(users, range(20, 40), lambda k: 5.0)
    out2 = env.client.post(f"{R}/ratings/batch", json=body2, headers=env.ingest_service).json()
    assert out2["created"] == 100 and out2["updated"] == 100
    for row, sent in zip(out2["results"], body2["ratings"], strict=True):
        assert row["status"] == ("updated" if int(sent["item_id"][1:]) < 30 else "created")
    with env.session() as s:
        stored = dict(((u, i), v) for u, i, v in s.execute(text(
            "SELECT us.external_id, it.external_id, r.value FROM ratings r "
            "JOIN users us ON us.id = r.user_id JOIN items it ON it.id = r.item_id")).all())
    want = {(x["user_id"], x["item_id"]): x["rating"] for x in body["ratings"] + body2["ratings"]}
    assert stored == want
    # idempotent: the same batch again changes no row count
    out3 = env.client.post(f"{R}/ratings/batch", json=body2, headers=env.ingest_service).json()
    assert out3["created"] == 0 and out3["updated"] == 200 and env.count("ratings") == 400


def test_a_large_batch_with_one_bad_row_writes_nothing(env: Env) -> None:
    add_items(env, N_ITEMS)
    body = _batch([f"u{k}" for k in range(5)], range(N_ITEMS), lambda k: 3.0)
    body["ratings"][137]["item_id"] = "ghost"
    body["ratings"][150]["rating"] = 9.0
    r = env.client.post(f"{R}/ratings/batch", json=body, headers=env.ingest_service)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_rows" and [e["index"] for e in err["details"]["rows"]] == [137, 150]
    assert env.count("ratings") == 0 and env.count("users") == 0


@pytest.mark.integration
def test_deleting_users_while_their_ratings_are_written_leaves_no_orphan(env: Env) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers; the race needs concurrent transactions")
    add_items(env, N_ITEMS)
    users = [f"racer{k}" for k in range(4)]
    maker = env.session
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        k = 0
        try:
            while not stop.is_set():
                size = (100, 8, 1)[k % 3]  # the staged (COPY) path, the array path, a single upsert
                rows = [(users[(seed + j + k) % len(users)], f"i{(seed * 7 + k + j) % N_ITEMS}", 1.0 + j % 5)
                        for j in range(size)]
                rows = list({(u, i): (u, i, v) for u, i, v in rows}.values())
                with maker() as s:
                    if size == 1:
                        ingest.upsert_rating(s, dataset="default", user_id=rows[0][0], item_id=rows[0][1],
                                             rating=rows[0][2])
                    else:
                        ingest.import_ratings(s, dataset="default", rows=rows)
                    s.commit()
                k += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def deleter() -> None:
        k = 0
        try:
            while not stop.is_set():
                with maker() as s:
                    try:
                        ingest.delete_user(s, user_id=users[k % len(users)])
                        s.commit()
                    except Exception as exc:  # noqa: BLE001
                        s.rollback()
                        if getattr(exc, "status_code", None) != 404:
                            raise
                k += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)] + [threading.Thread(target=deleter)]
    for t in threads:
        t.start()
    stop.wait(6.0)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    orphans = "SELECT count(*) FROM ratings r WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = r.user_id)"
    with maker() as s:
        assert s.execute(text(orphans)).scalar_one() == 0
        assert s.execute(text("SELECT count(*) FROM ratings")).scalar_one() > 0  # the race did write
        remaining = [u for (u,) in s.execute(text("SELECT external_id FROM users")).all()]
    for user in remaining:  # deleting a user still removes all of their ratings
        with maker() as s:
            ingest.delete_user(s, user_id=user)
            s.commit()
    assert env.count("ratings") == 0


def test_two_large_batches_in_one_transaction(env: Env) -> None:
    add_items(env, N_ITEMS)
    first = [(f"u{k}", f"i{j}", 2.0) for k in range(5) for j in range(20)]
    second = [(f"u{k}", f"i{j}", 4.0) for k in range(5) for j in range(10, 30)]
    with env.session() as s:
        ingest.import_ratings(s, dataset="default", rows=first)
        ingest.import_ratings(s, dataset="default", rows=second)
        s.commit()
    assert env.count("ratings") == 150
    with env.session() as s:
        values = sorted(v for (v,) in s.execute(text("SELECT value FROM ratings")).all())
    assert values == [2.0] * 50 + [4.0] * 100


def _wait_for_advisory_lock(env: Env, pid: int) -> None:
    """Block until backend ``pid`` waits for an advisory lock (the references lock)."""
    for _ in range(6000):  # polled; fails only if the backend never waits (the protocol is broken)
        with env.session() as s:
            state = s.execute(text("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = :p"),
                              {"p": pid}).one_or_none()
        if state is not None and tuple(state) == ("Lock", "advisory"):
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"backend {pid} never waited for the references lock")


def _run_in_thread(work) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=guarded)
    thread.start()
    return thread, errors


@pytest.mark.integration
@pytest.mark.parametrize("rows", [1, 8, 100])  # single upsert, array path, staged (COPY) path
def test_a_user_delete_waits_for_ratings_in_flight_then_removes_them(env: Env, rows: int) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers")
    add_items(env, 100)
    with env.session() as s:
        ingest.upsert_rating(s, dataset="default", user_id="gone", item_id="i0", rating=1.0)
        s.commit()
    writer = env.session()
    if rows == 1:
        ingest.upsert_rating(writer, dataset="default", user_id="gone", item_id="i1", rating=2.0)
    else:
        ingest.import_ratings(writer, dataset="default", rows=[("gone", f"i{k}", 3.0) for k in range(rows)])
    deleter = env.session()
    pid = deleter.execute(text("SELECT pg_backend_pid()")).scalar_one()

    def delete() -> None:
        ingest.delete_user(deleter, user_id="gone")
        deleter.commit()

    thread, errors = _run_in_thread(delete)
    _wait_for_advisory_lock(env, pid)  # the delete waits for the uncommitted ratings
    writer.commit()
    writer.close()
    thread.join()
    deleter.close()
    assert not errors, errors
    assert env.count("ratings") == 0 and env.count("users") == 0


@pytest.mark.integration
@pytest.mark.parametrize("rows", [1, 70])  # single upsert (one server-side call), staged batch
def test_ratings_written_while_a_delete_is_in_flight_wait_and_recreate_the_user(env: Env, rows: int) -> None:
    """A writer that waits for a user's delete sees the delete once it runs (its reads take their
    snapshots after the lock was granted): it creates the user afresh, and no rating is orphaned."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers")
    add_items(env, 100)
    with env.session() as s:
        ingest.import_ratings(s, dataset="default", rows=[("back", f"i{k}", 1.0) for k in range(100)])
        s.commit()
        old_id = s.execute(text("SELECT id FROM users WHERE external_id = 'back'")).scalar_one()
    deleter = env.session()
    assert ingest.delete_user(deleter, user_id="back") == 100  # uncommitted: holds the lock exclusively
    writer = env.session()
    pid = writer.execute(text("SELECT pg_backend_pid()")).scalar_one()

    def write() -> None:
        if rows == 1:
            out = ingest.upsert_rating(writer, dataset="default", user_id="back", item_id="i0", rating=4.0)
            assert out.status == "created"
        else:
            ingest.import_ratings(writer, dataset="default", rows=[("back", f"i{k}", 4.0) for k in range(rows)])
        writer.commit()

    thread, errors = _run_in_thread(write)
    _wait_for_advisory_lock(env, pid)
    deleter.commit()
    deleter.close()
    thread.join()
    writer.close()
    assert not errors, errors
    orphans = "SELECT count(*) FROM ratings r WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = r.user_id)"
    with env.session() as s:
        assert s.execute(text(orphans)).scalar_one() == 0
        assert s.execute(text("SELECT count(*), min(value) FROM ratings")).one() == (rows, 4.0)
        assert s.execute(text("SELECT id FROM users WHERE external_id = 'back'")).scalar_one() != old_id


def _wait_for_transaction(env: Env, pid: int) -> None:
    """Block until backend ``pid`` waits for another transaction (a unique-key check)."""
    for _ in range(6000):
        with env.session() as s:
            state = s.execute(text("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = :p"),
                              {"p": pid}).one_or_none()
        if state is not None and tuple(state) == ("Lock", "transactionid"):
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"backend {pid} never waited for the other writer")


def _second_waits_for_first(env: Env, first, second, write) -> None:
    """Run ``write`` (``second``'s writes) in a thread until ``second`` waits for ``first``'s
    uncommitted rows, then commit ``first``; both sessions closed, ``write`` raised nothing."""
    pid = second.execute(text("SELECT pg_backend_pid()")).scalar_one()
    thread, errors = _run_in_thread(write)
    _wait_for_transaction(env, pid)
    first.commit()
    first.close()
    thread.join()
    second.close()
    assert not errors, errors


@pytest.mark.integration
def test_two_writers_of_the_same_new_ratings_both_succeed_and_the_later_updates(env: Env) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers")
    ratings_postgres.PLAIN_INSERT_FIRST.reset()  # both try the plain INSERT
    add_items(env, N_ITEMS)
    rows = [(f"u{k}", f"i{j}", 2.0) for k in range(5) for j in range(N_ITEMS)]  # 200 rows: the staged path
    v0 = _version(env)
    first = env.session()
    assert ingest.upsert_ratings_batch(first, dataset="default", rows=_rating_rows(rows)).created == 200
    second = env.session()
    out: list[RatingBatchResult] = []

    def write() -> None:  # the plain INSERT waits for `first`, then fails on its keys: the upsert runs
        out.append(ingest.upsert_ratings_batch(second, dataset="default",
                                               rows=_rating_rows([(u, i, 4.5) for u, i, _ in rows])))
        second.commit()

    _second_waits_for_first(env, first, second, write)
    assert (out[0].created, out[0].updated) == (0, 200)
    assert {r["status"] for r in out[0].results} == {"updated"}
    with env.session() as s:
        assert s.execute(text("SELECT count(*), min(value), max(value) FROM ratings")).one() == (200, 4.5, 4.5)
    assert _version(env) == v0 + 400


@pytest.mark.integration
@pytest.mark.parametrize("first_commits", [True, False])
def test_two_single_upserts_of_a_new_users_first_rating(env: Env, first_commits: bool) -> None:
    """Two single upserts of a new user's rating at once (one server-side call each): the second
    waits on the first's new user row; if the first commits it finds that user and updates the
    rating, if it rolls back it creates the user and the rating itself. One user row either way."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers")
    add_items(env, 2)
    v0 = _version(env)
    first = env.session()
    assert ingest.upsert_rating(first, dataset="default", user_id="fresh", item_id="i0", rating=2.0).status == "created"
    second = env.session()
    out: list[str] = []

    def write() -> None:  # waits for `first`'s uncommitted user row (the unique external id)
        out.append(ingest.upsert_rating(second, dataset="default", user_id="fresh", item_id="i0", rating=4.5).status)
        second.commit()

    pid = second.execute(text("SELECT pg_backend_pid()")).scalar_one()
    thread, errors = _run_in_thread(write)
    _wait_for_transaction(env, pid)
    if first_commits:
        first.commit()
    else:
        first.rollback()
    first.close()
    thread.join()
    second.close()
    assert not errors, errors
    assert out == ["updated" if first_commits else "created"]
    with env.session() as s:
        assert s.execute(text("SELECT count(*) FROM users WHERE external_id = 'fresh'")).scalar_one() == 1
        assert s.execute(text("SELECT count(*), min(value) FROM ratings")).one() == (1, 4.5)
        assert s.execute(text(_ORPHANS)).scalar_one() == 0
    assert _version(env) == v0 + (2 if first_commits else 1)


def _rating_rows(rows: list[tuple[str, str, float]]) -> list[RatingRow]:
    return [RatingRow(user_id=u, item_id=i, rating=v) for u, i, v in rows]


_ORPHANS = "SELECT count(*) FROM ratings r WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = r.user_id)"


def _user_ids(env: Env) -> dict[str, int]:
    with env.session() as s:
        return {e: i for e, i in s.execute(text("SELECT external_id, id FROM users")).all()}


@pytest.mark.integration
def test_cached_user_ids_follow_deletes_rollbacks_and_plain_sql(env: Env) -> None:
    """Batches reuse user and item ids cached at commit; a user deleted (by the service or by
    plain SQL) or created by a transaction that rolled back is never reused."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("the id cache is PostgreSQL's")
    add_items(env, N_ITEMS)

    def batch(users: list[str], value: float, commit: bool = True) -> None:
        with env.session() as s:
            ingest.upsert_ratings_batch(s, dataset="default", rows=_rating_rows(
                [(u, f"i{j}", value) for u in users for j in range(20)]))
            if commit:
                s.commit()

    batch(["a", "b", "c"], 1.0)
    with env.session() as s:
        refs = reference_ids(s)
        ds_id = s.execute(text("SELECT id FROM datasets WHERE name = 'default'")).scalar_one()
    assert set(refs.users) == {"a", "b", "c"} and len(refs.items_of(ds_id)) == 20
    batch(["a", "b", "c"], 2.0)  # from the cache
    before = _user_ids(env)
    with env.session() as s:
        ingest.delete_user(s, user_id="a")
        s.commit()
    with env.session() as s:
        s.execute(text("DELETE FROM ratings WHERE user_id = :u"), {"u": before["b"]})
        s.execute(text("DELETE FROM users WHERE id = :u"), {"u": before["b"]})
        s.commit()
    batch(["ghost"], 3.0, commit=False)  # created, then rolled back
    batch(["a", "b", "c", "ghost"], 4.0)
    after = _user_ids(env)
    assert after["c"] == before["c"] and after["a"] != before["a"] and after["b"] != before["b"]
    with env.session() as s:
        assert s.execute(text(_ORPHANS)).scalar_one() == 0
        assert s.execute(text("SELECT count(*), min(value) FROM ratings")).one() == (80, 4.0)


@pytest.mark.integration
def test_ids_written_inside_a_savepoint_rolled_back_are_not_cached(env: Env) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("the id cache is PostgreSQL's")
    add_items(env, N_ITEMS)
    rows = _rating_rows([("inner", f"i{j}", 2.0) for j in range(20)])
    with env.session() as s:
        nested = s.begin_nested()
        ingest.upsert_ratings_batch(s, dataset="default", rows=rows)
        nested.rollback()
        s.commit()
    with env.session() as s:
        assert "inner" not in reference_ids(s).users
        ingest.upsert_ratings_batch(s, dataset="default", rows=rows)
        s.commit()
        assert s.execute(text(_ORPHANS)).scalar_one() == 0
    assert env.count("ratings") == 20


def test_after_a_batch_met_existing_ratings_the_next_few_skip_the_plain_insert() -> None:
    first = ratings_postgres.PlainInsertFirst()
    assert first.worth_trying() and first.worth_trying()
    first.missed()
    assert [first.worth_trying() for _ in range(ratings_postgres.UPSERTS_AFTER_A_MISS + 2)] == \
        [False] * ratings_postgres.UPSERTS_AFTER_A_MISS + [True, True]
    first.missed()
    first.reset()
    assert first.worth_trying()


@pytest.mark.integration
def test_new_users_are_inserted_plainly_unless_they_exist_or_a_concurrent_writer_creates_them(env: Env,
                                                                                           monkeypatch) -> None:
    """A batch's uncached users: one INSERT of them all, without a lookup or a conflict clause;
    where one exists, that fails and the next batches look them up, inserting the others (again
    without a conflict clause); where a concurrent writer creates one meanwhile, that fails too
    (after waiting for the writer) and the upsert of the users runs: every user once."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers")
    import psycopg

    add_items(env, N_ITEMS)
    ratings_postgres.NEW_USERS_FIRST.reset()
    statements: list[str] = []
    # Which of the three statements ran is invisible in the outcome by design (each gives the same
    # users): the driver's cursor is watched to tell them apart (by the store's statement texts).
    names = {ratings_postgres._DRIVER_NEW_USERS: "new",  # noqa: SLF001 - the statements told apart
             ratings_postgres._DRIVER_RATING_USERS_PLAIN: "lookup",  # noqa: SLF001
             ratings_postgres._DRIVER_RATING_USERS_UPSERT: "upsert"}  # noqa: SLF001
    original = psycopg.Cursor.execute

    def execute(self, query, *args, **kwargs):
        if query in names:
            statements.append(names[query])
        return original(self, query, *args, **kwargs)

    def batch(session, users: tuple[str, ...], item: str) -> None:
        ingest.upsert_ratings_batch(session, dataset="default", rows=_rating_rows([(u, item, 1.0) for u in users]))

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    with env.session() as s:
        batch(s, ("n0", "n1"), "i0")
        s.commit()
    assert statements == ["new"]
    with env.session() as s:
        reference_ids(s).users.clear()  # n0 and n1 exist but are not cached (as in another process)
        batch(s, ("n0", "n2"), "i1")
        s.commit()
    assert statements == ["new", "new", "lookup"]  # n0 exists: the INSERT of all fails
    first = env.session()
    batch(first, ("n3", "n4"), "i2")  # the next batches look their users up first
    second = env.session()

    def write() -> None:  # n4 is first's, uncommitted: the INSERT waits, then fails on it
        batch(second, ("n4", "n5"), "i3")
        second.commit()

    _second_waits_for_first(env, first, second, write)
    assert statements == ["new", "new", "lookup", "lookup", "lookup", "upsert"]
    assert sorted(_user_ids(env)) == [f"n{k}" for k in range(6)]
    with env.session() as s:
        assert s.execute(text(_ORPHANS)).scalar_one() == 0
        assert s.execute(text("SELECT count(*) FROM ratings")).scalar_one() == 8


def test_a_bad_row_undoes_the_batch_s_new_users(env: Env) -> None:
    """Where a row is invalid the batch's new users are rolled back before the 422 (on PostgreSQL
    the rows are checked while it inserts them: see the store contract), so nothing is written
    even if the caller commits."""
    from app.errors import InvalidRows

    add_items(env, N_ITEMS)
    rows = [(f"new{k}", f"i{k}", 1.0) for k in range(5)]
    for bad in ((0, "i0", 9.0), (0, "ghost", 1.0)):  # out of range; unknown item
        with env.session() as s:
            with pytest.raises(InvalidRows):
                ingest.upsert_ratings_batch(s, dataset="default",
                                            rows=_rating_rows(rows + [(f"new{bad[0]}x", bad[1], bad[2])]))
            s.commit()  # a caller that commits anyway writes nothing either
    assert env.count("users") == 0 and env.count("ratings") == 0
    with env.session() as s:
        assert ingest.upsert_ratings_batch(s, dataset="default", rows=_rating_rows(rows)).created == 5
        s.commit()
    assert env.count("users") == 5 and env.count("ratings") == 5
