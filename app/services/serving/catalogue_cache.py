"""The public catalogue facts serving filters with (inactive items, category -> items), cached
per data set with a short TTL. ``invalidate_catalog`` is called after a committed item write."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.db.stores import catalogue_store

__all__ = ["CATALOG_TTL_S", "Catalog", "invalidate_catalog", "catalog", "fresh_catalog", "load_catalog"]

CATALOG_TTL_S = 30.0


@dataclass(frozen=True)
class Catalog:
    """Public catalogue facts used for filtering: inactive items, category -> items."""

    stamp: float
    inactive: frozenset[str]
    by_category: dict[str, frozenset[str]]


_lock = threading.Lock()
_refresh_lock = threading.Lock()
_catalogs: dict[str, Catalog] = {}


def invalidate_catalog(dataset: str | None = None) -> None:
    """Forget cached catalogue facts (called after item writes in this process)."""
    with _lock:
        if dataset is None:
            _catalogs.clear()
        else:
            _catalogs.pop(dataset, None)


def load_catalog(session: Session, dataset_id: int) -> Catalog:
    """The catalogue facts, read from the items that carry one: inactive or with a category.

    Every process reloads them every ``CATALOG_TTL_S`` on a request's path; reading (and decoding
    the categories of) all 20,000 items of a typical catalogue cost 50-110 ms of CPU in that
    process each time, while the requests it served waited, so the store reads only the items
    that carry a fact (:meth:`~app.db.stores.catalogue.CatalogueStore.items_carrying_a_fact`).
    """
    inactive: set[str] = set()
    by_category: dict[str, set[str]] = {}
    for ext, cats, is_active in catalogue_store(session).items_carrying_a_fact(dataset_id):
        if not is_active:
            inactive.add(ext)
        for c in cats or ():
            by_category.setdefault(str(c), set()).add(ext)
    return Catalog(stamp=time.monotonic(), inactive=frozenset(inactive),
                   by_category={k: frozenset(v) for k, v in by_category.items()})


def fresh_catalog(dataset: str) -> Catalog | None:
    """The cached catalogue of ``dataset`` while it is within its TTL; None otherwise."""
    cat = _catalogs.get(dataset)
    return cat if cat is not None and time.monotonic() - cat.stamp < CATALOG_TTL_S else None


def catalog(session: Session, dataset_id: int, dataset: str) -> Catalog:
    """The cached catalogue; after the TTL one thread reloads it while the others keep using
    the previous copy (no thundering herd on large catalogues)."""
    cat = fresh_catalog(dataset)
    if cat is not None:
        return cat
    cat = _catalogs.get(dataset)
    if not _refresh_lock.acquire(blocking=cat is None):
        return cat  # type: ignore[return-value]  # another thread is refreshing
    try:
        current = _catalogs.get(dataset)
        if current is not None and current is not cat and time.monotonic() - current.stamp < CATALOG_TTL_S:
            return current
        fresh = load_catalog(session, dataset_id)
        with _lock:
            _catalogs[dataset] = fresh
        return fresh
    finally:
        _refresh_lock.release()
