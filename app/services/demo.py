"""A synthetic demo data set for the embedded mode: items with public categories, users and
ratings from the production-shaped generator, and a first DP training run so that the service
can recommend out of the box. Seeded only into an empty database."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.data.synthetic import production_synthetic
from app.db.stores.admin import holds_nothing
from app.schemas.ingest import ItemIn
from app.services import catalog, ingest
from app.services.training.dispatch import enqueue_run
from app.services.training.requests import start_training
from app.services.unit_of_work import after_commit

__all__ = ["DEMO_CATEGORIES", "seed_if_empty", "seed"]

log = logging.getLogger("privrec.demo")

DEMO_CATEGORIES = ("action", "comedy", "drama", "documentary", "family", "sci-fi", "thriller", "romance")


def seed(session: Session, *, dataset: str, n_users: int = 2000, n_items: int = 500,
         n_ratings: int = 60_000, seed: int = 7) -> int:
    """Write the demo catalogue and ratings into ``dataset`` (caller commits); return #ratings."""
    data = production_synthetic(n_users, n_items, n_ratings, rank=8, seed=seed)
    rng = np.random.default_rng(seed)
    ds = catalog.get_dataset(session, dataset)
    for k in range(n_items):
        cats = sorted({DEMO_CATEGORIES[int(c)] for c in rng.choice(len(DEMO_CATEGORIES), size=rng.integers(1, 3))})
        catalog.upsert_item(session, dataset=dataset, item_id=f"item-{k}",
                           data=ItemIn(title=f"Demo item {k}", categories=cats, features={"year": int(1970 + k % 50)}))
    coo = data.ratings.csr.tocoo()
    lo, hi = ds.rating_min, ds.rating_max
    values = np.clip(coo.data, lo, hi)
    users = [f"user-{int(u)}" for u in np.asarray(data.ratings.user_ids)[coo.row]]
    items = [f"item-{int(i)}" for i in np.asarray(data.ratings.item_ids)[coo.col]]
    return ingest.import_ratings(session, dataset=dataset, rows=list(zip(users, items, values.tolist(), strict=True)))


def seed_if_empty(session: Session, *, dataset: str, settings: Settings) -> bool:
    """Seed ``dataset`` and reserve a first training run when it holds nothing yet (the caller
    commits both at once; the run is enqueued after that commit)."""
    ds = catalog.get_dataset(session, dataset)
    if not holds_nothing(session, ds.id):
        return False
    n = seed(session, dataset=ds.name)
    run_id = _start_demo_run(session, ds.name, settings)
    after_commit(session, lambda: log.info("demo data set %r seeded with %d synthetic ratings", dataset, n))
    if run_id is not None:
        after_commit(session, partial(enqueue_run, run_id, settings=settings))
    return True


def _start_demo_run(session: Session, dataset: str, settings: Settings) -> int | None:
    """Reserve the demo's first run in a savepoint: if it cannot start, the seeded data stays."""
    try:
        with session.begin_nested():
            run = start_training(session, dataset=dataset, epsilon=min(1.0, settings.default_epsilon_cap / 2),
                                 actor="demo", trigger="demo", idempotency_key="demo-initial")
            return int(run.id)
    except Exception as exc:  # noqa: BLE001 - the demo still serves; the admin can train later
        log.warning("could not queue the demo training run: %s", exc)
        return None
