"""Alembic builds the same schema on SQLite and PostgreSQL; settings are validated at start-up."""

from __future__ import annotations

import pytest
from alembic import command
from pydantic import ValidationError
from sqlalchemy import create_engine, inspect, pool, text

from app.config import DEFAULT_SECRET_KEY, Settings
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
