"""Recommendations on the event loop (PostgreSQL): grouped reads give each user exactly their own
rows, the answer equals the session path's, and a dead pooled connection is replaced. On SQLite
the loop path declines and the session path answers."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from app.db import async_read, hot_read
from app.db.stores.serving import ACTIVE_AND_RATINGS_MANY, active_and_ratings
from app.schemas.serving import RecommendationQuery
from app.services.serving import recommend
from app.services.serving.active import ratings_from_rows
from tests.api.conftest import Env, seed_ratings, train_and_publish

USERS = ["u0", "u1", "u2", "u3", "u4", "u5", "nobody"]
QUERY = RecommendationQuery(n=8, categories=None, exclude=[])


def _bind(env: Env) -> Any:
    return env.client.app.state.sessionmaker.kw["bind"]  # type: ignore[attr-defined]


def _session_rows(env: Env, user: str) -> list[tuple[Any, ...]]:
    with env.session() as s:
        return sorted(tuple(r) for r in active_and_ratings(s, "default", user))


def _published(env: Env) -> None:
    seed_ratings(env)
    train_and_publish(env)
    for user in USERS:  # warm this process's caches through the route (the model, its row positions)
        r = env.client.get(f"/v1/datasets/default/users/{user}/recommendations", params={"n": 8}, headers=env.auth(user))
        assert r.status_code == 200, r.text


def test_grouped_reads_give_each_user_their_own_rows(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _published(env)
    if env.settings.database_url.startswith("sqlite"):
        assert asyncio.run(hot_read.read_rows_async(_bind(env), ACTIVE_AND_RATINGS_MANY, {"dataset": "default"},
                                                    "u0", 4)) is None
        return
    statements: list[list[str]] = []
    real_rows = async_read.AsyncReadPool.rows

    async def counted(self: async_read.AsyncReadPool, sql: str, params: Any) -> Any:
        statements.append(list(params["keys"]))
        return await real_rows(self, sql, params)

    # the pool's own statement method, watched: how reads were grouped is invisible in their rows
    monkeypatch.setattr(async_read.AsyncReadPool, "rows", counted)

    async def read_all() -> list[Any]:
        return await asyncio.gather(*(hot_read.read_rows_async(_bind(env), ACTIVE_AND_RATINGS_MANY,
                                                               {"dataset": "default"}, u, 4) for u in USERS * 2))

    got = asyncio.run(read_all())
    for user, rows in zip(USERS * 2, got, strict=True):
        assert sorted(tuple(r) for r in rows) == _session_rows(env, user)
        assert ratings_from_rows(rows) is not None
    assert len(statements) < len(USERS) * 2  # grouped: the reads that waited went together
    assert all(len(set(keys)) == len(keys) for keys in statements)  # a key waiting twice is read once
    assert {k for keys in statements for k in keys} == set(USERS)


def test_the_loop_path_answers_as_the_session_path(env: Env) -> None:
    _published(env)
    bind = _bind(env)
    for user in USERS:
        on_loop = asyncio.run(recommend.recommend_on_loop(bind, 4, dataset="default", user_id=user, query=QUERY))
        with env.session() as s:
            expected = recommend.recommend_for_user(s, dataset="default", user_id=user, query=QUERY)
        if env.settings.database_url.startswith("sqlite"):
            assert on_loop is None
        else:
            assert on_loop is not None and on_loop.model_dump() == expected.model_dump()
    missing = asyncio.run(recommend.recommend_on_loop(bind, 4, dataset="nope", user_id="u0", query=QUERY))
    assert missing is None  # unknown data set: the session path gives the 404
    r = env.client.get("/v1/datasets/nope/users/u0/recommendations", headers=env.auth("u0"))
    assert r.status_code == 404, r.text


def test_a_dead_pooled_connection_is_replaced(env: Env) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL connections only")
    _published(env)
    bind = _bind(env)
    dsn = bind.url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def read_kill_read() -> tuple[Any, Any]:
        first = await recommend.recommend_on_loop(bind, 4, dataset="default", user_id="u0", query=QUERY)
        with psycopg.connect(dsn, autocommit=True) as admin:  # the server drops every other connection
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        second = await recommend.recommend_on_loop(bind, 4, dataset="default", user_id="u0", query=QUERY)
        return first, second

    first, second = asyncio.run(read_kill_read())
    assert first is not None and second is not None and first.model_dump() == second.model_dump()


def test_groups_of_many_data_set_names_stay_bounded(env: Env) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL reads only")
    bind = _bind(env)

    async def read_many() -> list[Any]:
        return [await hot_read.read_rows_async(bind, ACTIVE_AND_RATINGS_MANY, {"dataset": f"ds{k}"}, "u0", 4)
                for k in range(hot_read.MAX_GROUPS + 50)]

    assert all(rows == [] for rows in asyncio.run(read_many()))  # unknown data sets: no rows
    assert hot_read.open_groups() <= hot_read.MAX_GROUPS


def _held_first_statement(monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[str]], dict[str, asyncio.Event]]:
    """Count the grouped statements; the first one waits for ``gate["release"]`` (set per loop)."""
    statements: list[list[str]] = []
    gate: dict[str, asyncio.Event] = {}
    real_rows = async_read.AsyncReadPool.rows

    async def held(self: async_read.AsyncReadPool, sql: str, params: Any) -> Any:
        statements.append(sorted(params["keys"]))
        if len(statements) == 1:
            await gate["release"].wait()  # a statement held up (PostgreSQL's backend without a core)
        return await real_rows(self, sql, params)

    # the pool's own statement method, watched: how reads were grouped is invisible in their rows
    monkeypatch.setattr(async_read.AsyncReadPool, "rows", held)
    return statements, gate


@pytest.mark.parametrize("second_after_s", [3600.0, 0.01])
def test_reads_wait_for_the_statement_in_flight_until_the_second_slot_opens(
        env: Env, monkeypatch: pytest.MonkeyPatch, second_after_s: float) -> None:
    """One statement in flight: reads that arrive meanwhile wait and go together in the next one;
    only a statement out for GROUP_SECOND_AFTER_S lets a second one go (its reads answered while
    the first is still held up)."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL reads only")
    _published(env)
    bind = _bind(env)
    monkeypatch.setattr(hot_read, "GROUP_SECOND_AFTER_S", second_after_s)
    statements, gate = _held_first_statement(monkeypatch)

    def read(user: str) -> Any:
        return hot_read.read_rows_async(bind, ACTIVE_AND_RATINGS_MANY, {"dataset": "default"}, user, 4)

    async def scenario() -> tuple[bool, list[Any]]:
        gate["release"] = asyncio.Event()
        first = asyncio.ensure_future(read("u0"))
        while not statements:  # the first statement is out
            await asyncio.sleep(0)
        later = asyncio.gather(read("u1"), read("u2"))
        if second_after_s > 60:
            await asyncio.sleep(0.05)
            assert len(statements) == 1  # u1 and u2 wait for the statement in flight
            gate["release"].set()
            return False, [await first, *await later]
        rows = await asyncio.wait_for(later, 30)  # answered by the second slot while the first is held
        first_done = first.done()
        gate["release"].set()
        return first_done, [await first, *rows]

    first_done_early, got = asyncio.run(scenario())
    assert not first_done_early
    assert statements == [["u0"], ["u1", "u2"]]  # the two waiting reads went together
    for user, rows in zip(["u0", "u1", "u2"], got, strict=True):
        assert sorted(tuple(r) for r in rows) == _session_rows(env, user)
