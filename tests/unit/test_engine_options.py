"""Engines are built from the options their owner passes (never from a settings lookup)."""

from __future__ import annotations

from app.config import Settings
from app.db.session import DEFAULT_ENGINE_OPTIONS, EngineOptions, dispose_engines, engine_options, get_engine, open_database


def test_engine_uses_the_options_it_is_given() -> None:
    try:
        engine = get_engine("postgresql://nobody@127.0.0.1:1/never_connected", EngineOptions(pool_size=3))
        assert engine.pool.size() == 3  # type: ignore[attr-defined]
    finally:
        dispose_engines()


def test_open_database_builds_the_engine_from_the_given_settings(tmp_path) -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/never_connected", db_pool_size=7,
                        redis_url=None, seed_demo=False, embedded_worker=False)
    try:
        assert engine_options(settings).pool_size == 7
        url = open_database(settings)
        assert url == settings.database_url
        assert get_engine(url).pool.size() == 7  # type: ignore[attr-defined]
        other = f"sqlite:///{tmp_path / 'own.db'}"
        assert open_database(settings, other) == other  # a caller's own database wins
    finally:
        dispose_engines()


def test_default_options_are_the_settings_defaults() -> None:
    fields = Settings.model_fields
    from_settings = EngineOptions(echo=fields["db_echo"].default, pool_size=fields["db_pool_size"].default,
                                  sqlite_busy_timeout_ms=fields["sqlite_busy_timeout_ms"].default)
    assert from_settings == DEFAULT_ENGINE_OPTIONS
