"""Transaction slots (``app.api.deps.transaction_slot``): a request's session opens only once it
holds one of the database's slots, so requests queue on the event loop, not on SQLite's write
lock or the connection pool; a request that gets no slot in time is a 503 with ``Retry-After``
before its route runs; one slot per request, however many sessions it asks for."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from app.api.deps import SessionDep, WriteSessionDep, slot_capacity
from app.api.errors import install_error_handlers
from app.db.session import EngineOptions, get_sessionmaker

HOLD_S = 0.2  # each request holds the write lock this long: 4x SQLite's busy timeout below


def _app(maker: sessionmaker[Session]) -> FastAPI:
    app = FastAPI()
    app.state.sessionmaker = maker
    install_error_handlers(app)
    with maker() as session, session.begin():
        session.execute(text("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY)"))

    @app.post("/rows/{k}")
    def write(k: int, session: WriteSessionDep) -> dict[str, int]:
        session.execute(text("INSERT INTO t (k) VALUES (:k)"), {"k": k})  # takes the write lock
        time.sleep(HOLD_S)
        return {"k": k}

    @app.post("/both/{k}")
    def both(k: int, read: SessionDep, write: WriteSessionDep) -> dict[str, int]:
        write.execute(text("INSERT INTO t (k) VALUES (:k)"), {"k": k})
        assert read is not write
        return {"k": k}

    return app


def _rows(maker: sessionmaker[Session]) -> int:
    with maker() as session:
        return int(session.execute(text("SELECT count(*) FROM t")).scalar_one())


def test_sqlite_requests_queue_for_the_slot_not_on_the_write_lock(tmp_path: Path) -> None:
    """Eight concurrent writers, each holding SQLite's write lock 4x longer than the busy
    timeout: without slots most of them would fail with "database is locked"; with them
    every one waits its turn on the loop and succeeds."""
    maker = get_sessionmaker(f"sqlite:///{tmp_path / 'slot.db'}", EngineOptions(sqlite_busy_timeout_ms=50))
    with TestClient(_app(maker)) as client, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda k: client.post(f"/rows/{k}").status_code, range(8)))
    assert statuses == [200] * 8
    assert _rows(maker) == 8
    maker.kw["bind"].dispose()


def test_no_slot_in_time_is_a_503_with_retry_after_before_the_route_runs(tmp_path: Path) -> None:
    """The slot's wait is the pool's timeout (here 0.05 s); the refused request never opened a
    session, so nothing of it was written."""
    engine = create_engine(f"sqlite:///{tmp_path / 'slot.db'}", pool_timeout=0.05)
    maker = sessionmaker(engine)
    with TestClient(_app(maker), raise_server_exceptions=False) as client, ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, "/rows/1")
        time.sleep(HOLD_S / 4)  # the first request holds the only slot
        second = client.post("/rows/2")
        assert first.result().status_code == 200
    assert second.status_code == 503, second.text
    assert second.json()["error"]["code"] == "database_unavailable"
    assert second.headers["Retry-After"] == "2"
    with maker() as session:
        assert session.execute(text("SELECT k FROM t")).scalars().all() == [1]
    engine.dispose()


def test_one_slot_per_request_however_many_sessions_it_asks_for(tmp_path: Path) -> None:
    """A route with a read and a write session holds one slot (of one on SQLite): it does not
    wait on itself, and the slot is free again for the next request."""
    maker = get_sessionmaker(f"sqlite:///{tmp_path / 'slot.db'}", EngineOptions(sqlite_busy_timeout_ms=50))
    done = threading.Event()
    with TestClient(_app(maker)) as client:
        def call() -> None:
            assert client.post("/both/1").status_code == 200
            assert client.post("/both/2").status_code == 200
            done.set()

        threading.Thread(target=call, daemon=True).start()
        assert done.wait(10), "a request waited on its own transaction slot"
    assert _rows(maker) == 2
    maker.kw["bind"].dispose()


def test_capacity_follows_the_engine() -> None:
    """SQLite: one (its write lock); a bounded pool: its size plus overflow; no bound: none."""
    assert slot_capacity(create_engine("sqlite://")) == 1
    pg = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # never connected
    assert slot_capacity(create_engine(pg, pool_size=3, max_overflow=2)) == 5
    assert slot_capacity(create_engine(pg, pool_size=3, max_overflow=-1)) is None
    assert slot_capacity(create_engine(pg, poolclass=NullPool)) is None
    assert slot_capacity(None) is None
