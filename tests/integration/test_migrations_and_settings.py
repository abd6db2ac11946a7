"""Alembic builds the same schema on SQLite and PostgreSQL; settings are validated at start-up."""

from __future__ import annotations

import pytest
from alembic import command
from pydantic import ValidationError
from sqlalchemy import create_engine, exc, inspect, pool, text

from app.config import DEFAULT_SECRET_KEY, Settings
from app.db import session as db_session
from app.db.migrate import alembic_config, current_revision, head_revision, upgrade_head
from app.db.models import Base
from app.db.session import get_engine, normalise_url


def test_upgrade_head_matches_the_models_and_round_trips(db_url):
    assert current_revision(db_url) == head_revision()
    upgrade_head(db_url)  # idempotent
    command.check(alembic_config(db_url))  # raises when the models and the migrations differ
    command.downgrade(alembic_config(db_url), "base")
    engine = create_engine(normalise_url(db_url), poolclass=pool.NullPool)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade_head(db_url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()


_RATING_ROWS = [(1, 10, 100, 4.5), (1, 10, 101, 2.0), (2, 11, 100, 3.0)]  # (data set, user, item, value)


def _rating_rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT dataset_id, user_id, item_id, value FROM ratings ORDER BY dataset_id, user_id, item_id"))]


def test_ratings_natural_key_migration_keeps_rows_both_ways(db_url):
    """0007 makes (user, data set, item) the ratings' primary key and drops the surrogate id;
    its downgrade numbers the kept rows again. Rows survive both ways; the key stays unique."""
    engine = create_engine(normalise_url(db_url), poolclass=pool.NullPool)
    command.downgrade(alembic_config(db_url), "0005")
    with engine.begin() as conn:  # no foreign keys on ratings since 0005: bare rows suffice
        for ds, user, item, value in _RATING_ROWS:
            conn.execute(text("INSERT INTO ratings (dataset_id, user_id, item_id, value, created_at, updated_at) "
                              "VALUES (:ds, :u, :i, :v, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"),
                         {"ds": ds, "u": user, "i": item, "v": value})
    upgrade_head(db_url)
    assert _rating_rows(engine) == sorted(_RATING_ROWS)
    ratings = inspect(engine)
    assert "id" not in {c["name"] for c in ratings.get_columns("ratings")}
    assert ratings.get_pk_constraint("ratings")["constrained_columns"] == ["user_id", "dataset_id", "item_id"]
    with pytest.raises(exc.IntegrityError), engine.begin() as conn:
        conn.execute(text("INSERT INTO ratings (dataset_id, user_id, item_id, value, created_at, updated_at) "
                          "VALUES (1, 10, 100, 1.0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    command.downgrade(alembic_config(db_url), "0005")
    assert _rating_rows(engine) == sorted(_RATING_ROWS)
    with engine.begin() as conn:  # the restored id numbers new rows too
        conn.execute(text("INSERT INTO ratings (dataset_id, user_id, item_id, value, created_at, updated_at) "
                          "VALUES (3, 12, 100, 5.0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        ids = [r[0] for r in conn.execute(text("SELECT id FROM ratings"))]
    assert len(set(ids)) == len(_RATING_ROWS) + 1 and None not in ids
    upgrade_head(db_url)
    assert _rating_rows(engine) == sorted([*_RATING_ROWS, (3, 12, 100, 5.0)])
    engine.dispose()


def test_sqlite_connections_are_configured(sqlite_url):
    with get_engine(sqlite_url).connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() > 0


def test_default_secret_refused_outside_embedded_mode():
    assert Settings(redis_url=None).embedded
    with pytest.raises(ValidationError, match="SECRET_KEY"):
        Settings(redis_url="redis://127.0.0.1:6379/0")
    ok = Settings(redis_url="redis://127.0.0.1:6379/0", secret_key="x" * 32)
    assert not ok.embedded and ok.secret_key != DEFAULT_SECRET_KEY


def test_settings_reject_bad_values(monkeypatch):
    with pytest.raises(ValidationError):
        Settings(secret_key="short")
    with pytest.raises(ValidationError):
        Settings(default_rating_min=5.0, default_rating_max=1.0)
    with pytest.raises(ValidationError):
        Settings(max_batch_size=10_001)
    with pytest.raises(ValidationError):
        Settings(run_heartbeat_s=10, run_stale_after_s=5)
    monkeypatch.setenv("RETRAIN_INTERVAL_S", "60")
    monkeypatch.setenv("REDIS_URL", "")
    s = Settings()
    assert s.retrain_interval_s == 60 and s.embedded


def _terminate(pid: int) -> None:
    from tests.integration.conftest import _pg_admin

    with _pg_admin() as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)


def _backend_pid(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_pooled_connection_idle_past_the_limit_is_pinged_and_replaced(pg_url, monkeypatch):
    monkeypatch.setattr(db_session, "PING_AFTER_IDLE_S", 0.0)  # every checkout counts as idle
    engine = get_engine(pg_url)
    pid = _backend_pid(engine)
    _terminate(pid)
    assert _backend_pid(engine) != pid  # the ping found it dead: a fresh connection, no error


def test_a_busy_pooled_connection_is_not_pinged_and_a_dead_one_fails_once(pg_url, monkeypatch):
    monkeypatch.setattr(db_session, "PING_AFTER_IDLE_S", 3600.0)
    engine = get_engine(pg_url)
    pid = _backend_pid(engine)
    _terminate(pid)
    with pytest.raises(exc.DBAPIError) as failed, engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    assert failed.value.connection_invalidated  # the pool is invalidated: the next checkout connects afresh
    assert _backend_pid(engine) != pid
