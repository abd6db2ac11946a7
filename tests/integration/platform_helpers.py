"""Helpers shared by the platform tests (settings, data set creation, seeding)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import insert, select

from app.config import Settings
from app.core.data.ratings import Ratings
from app.db.models import Dataset, Item, Rating, User, bump_ratings_version
from app.db.session import session_scope
from app.services.budget import ensure_dataset


def make_settings(tmp_path: Path, url: str, **overrides) -> Settings:
    values = dict(
        database_url=url,
        redis_url=None,
        artifact_dir=tmp_path / "artifacts",
        run_heartbeat_s=0.2,
        run_stale_after_s=2.0,
        retrain_epsilon=1.0,
        retrain_interval_s=3600,
        embedded_poll_s=0.1,
    )
    values.update(overrides)
    return Settings(**values)


def schedule_clock(settings: Settings) -> Callable[[], datetime]:
    """Successive scheduler ticks, one retrain interval apart, from the start of the current UTC month
    (so that no privacy block opens between them in a short test)."""
    now = datetime.now(UTC)
    ticks = itertools.count()
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    return lambda: start + next(ticks) * timedelta(seconds=settings.retrain_interval_s)


def create_dataset(url: str, name: str = "default", *, cap: float = 10.0, delta: float = 1e-6, lo: float = 1.0,
                   hi: float = 5.0, relation: str = "add_or_remove_one_user", person_budget: str | None = None,
                   person_cap: float | None = None) -> int:
    """A data set under ``relation``. Its per-person budget: ``all`` for add/remove, else one named
    after the relation; its cap is raised to ``person_cap`` (default: the data set's cap, so that a
    test of one data set is bounded by that data set's cap) at the data set's delta."""
    person_budget = person_budget or ("all" if relation == "add_or_remove_one_user" else relation)
    with session_scope(url) as s:
        ensure_person_budget(s, person_budget, cap=person_cap or cap, delta=delta, relation=relation)
    with session_scope(url) as s:
        return ensure_dataset(s, name, rating_min=lo, rating_max=hi, epsilon_cap=cap, delta=delta,
                              relation=relation, person_budget=person_budget).id


def ensure_person_budget(s, name: str, *, cap: float, delta: float, relation: str) -> None:
    """Create the per-person budget ``name``, or raise its cap to at least ``cap``."""
    from app import ledger
    from app.db.models import PersonBudget

    pb = s.scalar(select(PersonBudget).where(PersonBudget.name == name))
    if pb is None and name != "all":
        ledger.open_person_budget(s, name, epsilon_cap=cap, delta=delta, relation=relation, actor="test")
    elif ledger.person_budget_named(s, name).epsilon_cap < cap:
        ledger.change_person_cap(s, name=name, new_cap=cap, reason="test set-up: one data set per test", actor="test")


def seed_ratings(url: str, dataset: str, ratings: Ratings, *, user_prefix: str = "u") -> None:
    """Insert the users, items and ratings of ``ratings`` (external ids = prefix + index)."""
    with session_scope(url) as s:
        ds = s.scalar(select(Dataset).where(Dataset.name == dataset))
        user_ext = [f"{user_prefix}{x}" for x in ratings.user_ids.tolist()]
        item_ext = [f"i{x}" for x in ratings.item_ids.tolist()]
        existing_users = dict(s.execute(select(User.external_id, User.id)).all())
        new_users = [{"external_id": e} for e in user_ext if e not in existing_users]
        if new_users:
            s.execute(insert(User), new_users)
        existing_items = dict(s.execute(select(Item.external_id, Item.id).where(Item.dataset_id == ds.id)).all())
        new_items = [{"dataset_id": ds.id, "external_id": e, "title": f"Item {e}", "categories": ["demo"], "features": {}}
                     for e in item_ext if e not in existing_items]
        if new_items:
            s.execute(insert(Item), new_items)
        users = dict(s.execute(select(User.external_id, User.id)).all())
        items = dict(s.execute(select(Item.external_id, Item.id).where(Item.dataset_id == ds.id)).all())
        rows, cols, vals = ratings.coo()
        uid = np.array([users[e] for e in user_ext])[rows]
        iid = np.array([items[e] for e in item_ext])[cols]
        batch = [
            {"dataset_id": ds.id, "user_id": int(u), "item_id": int(i), "value": float(v)}
            for u, i, v in zip(uid.tolist(), iid.tolist(), np.asarray(vals).tolist(), strict=True)
        ]
        for start in range(0, len(batch), 20_000):
            s.execute(insert(Rating), batch[start : start + 20_000])
        bump_ratings_version(s, ds.id)


def synthetic_ratings(n_users: int = 300, n_items: int = 60, n_ratings: int = 3000, seed: int = 0) -> Ratings:
    """Small production-shaped ratings in [1, 5]."""
    from app.core.data.synthetic import production_synthetic

    return production_synthetic(n_users, n_items, n_ratings, rank=4, seed=seed).ratings
