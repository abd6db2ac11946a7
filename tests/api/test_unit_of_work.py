"""One commit per request: the write session commits once when the route returns, and only then
runs what waits for it (cache invalidation, enqueueing); an error rolls everything back and runs
nothing."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.api.deps import WriteSessionDep
from app.services.unit_of_work import after_commit, commit


def _maker(tmp_path: Path) -> sessionmaker[Session]:
    engine = create_engine(f"sqlite:///{tmp_path / 'uow.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (k INTEGER PRIMARY KEY)"))
    return sessionmaker(engine)


def _rows(maker: sessionmaker[Session]) -> int:
    with maker() as other:  # a second connection sees committed rows only
        return int(other.execute(text("SELECT count(*) FROM t")).scalar_one())


def test_after_commit_actions_run_once_the_writes_are_durable(tmp_path: Path) -> None:
    maker = _maker(tmp_path)
    seen: list[int] = []
    with maker() as session:
        session.execute(text("INSERT INTO t (k) VALUES (1)"))
        after_commit(session, lambda: seen.append(_rows(maker)))
        assert seen == []
        commit(session)
    assert seen == [1]


def test_a_rolled_back_unit_runs_no_action(tmp_path: Path) -> None:
    maker = _maker(tmp_path)
    seen: list[str] = []
    with maker() as session:
        session.execute(text("INSERT INTO t (k) VALUES (1)"))
        after_commit(session, lambda: seen.append("ran"))
        session.rollback()
    assert seen == [] and _rows(maker) == 0


def test_a_rolled_back_units_actions_never_run_at_a_later_commit(tmp_path: Path) -> None:
    maker = _maker(tmp_path)
    seen: list[str] = []
    with maker() as session:
        session.execute(text("INSERT INTO t (k) VALUES (1)"))
        after_commit(session, lambda: seen.append("first"))
        session.rollback()
        session.execute(text("INSERT INTO t (k) VALUES (2)"))
        after_commit(session, lambda: seen.append("second"))
        commit(session)
    assert seen == ["second"] and _rows(maker) == 1


def test_a_savepoint_rollback_keeps_the_units_actions(tmp_path: Path) -> None:
    maker = _maker(tmp_path)
    seen: list[str] = []
    with maker() as session:
        session.execute(text("INSERT INTO t (k) VALUES (1)"))
        after_commit(session, lambda: seen.append("unit"))
        savepoint = session.begin_nested()
        session.execute(text("INSERT INTO t (k) VALUES (2)"))
        savepoint.rollback()
        commit(session)
    assert seen == ["unit"] and _rows(maker) == 1


def _app(tmp_path: Path, seen: list[str]) -> tuple[TestClient, sessionmaker[Session]]:
    app = FastAPI()
    app.state.sessionmaker = maker = _maker(tmp_path)

    @app.exception_handler(IntegrityError)
    async def conflict(_request, _exc) -> JSONResponse:
        return JSONResponse({"error": {"code": "conflict"}}, status_code=409)

    @app.post("/rows/{k}")
    def write(k: int, session: WriteSessionDep) -> dict[str, int]:
        session.execute(text("INSERT INTO t (k) VALUES (:k)"), {"k": k})
        after_commit(session, lambda: seen.append(f"after {k}: {_rows(maker)} row(s)"))
        return {"k": k}

    return TestClient(app, raise_server_exceptions=False), maker


def test_a_write_route_commits_once_then_runs_its_actions(tmp_path: Path) -> None:
    seen: list[str] = []
    client, maker = _app(tmp_path, seen)
    assert client.post("/rows/1").status_code == 200
    assert seen == ["after 1: 1 row(s)"] and _rows(maker) == 1


def test_a_failed_write_is_the_response_commits_nothing_and_runs_no_action(tmp_path: Path) -> None:
    seen: list[str] = []
    client, maker = _app(tmp_path, seen)
    with maker() as session:  # k=1 exists: the route's INSERT conflicts
        session.execute(text("INSERT INTO t (k) VALUES (1)"))
        session.commit()
    r = client.post("/rows/1")
    assert r.status_code == 409 and seen == [] and _rows(maker) == 1
