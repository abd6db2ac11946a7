"""Programmatic Alembic: ``upgrade_head(url)`` builds or upgrades the schema (``privrec migrate``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from app.db.session import normalise_url

__all__ = ["alembic_config", "upgrade_head", "current_revision", "head_revision"]

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` using the repository's ``migrations/`` scripts."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = normalise_url(url)
    return cfg


def upgrade_head(url: str) -> None:
    """Apply every migration up to head on ``url`` (idempotent)."""
    command.upgrade(alembic_config(url), "head")


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head() or ""


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at (``None`` when not migrated)."""
    engine = create_engine(normalise_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
