"""DP-CMF's public inputs as stored: item metadata, declared-public similarity sources and their
neighbour lists, and public users (their consent and its audit trail). Nothing here commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.dialect import chunks, rows_matched
from app.db.models import (
    Item,
    ItemSimilarity,
    PublicRatingConsent,
    PublicRatingConsentEvent,
    SimilaritySource,
    User,
    table_of,
)

__all__ = [
    "consent", "consent_events_page", "delete_source", "item_metadata", "lock_consent", "neighbour_list",
    "public_similarities", "public_user_ids", "public_users_page", "replace_lists", "source", "source_counts",
    "sources_page",
]


def public_user_ids(session: Session, dataset_id: int) -> np.ndarray:
    """Database ids of the users whose ratings of the data set are public now (sorted)."""
    ids = session.scalars(select(PublicRatingConsent.user_id).where(
        PublicRatingConsent.dataset_id == dataset_id, PublicRatingConsent.public.is_(True)))
    return np.sort(np.fromiter(ids, dtype=np.int64))


def item_metadata(session: Session, dataset_id: int) -> list[tuple[int, Any, Any]]:
    """(item id, categories, features) of every item of the data set."""
    rows = session.execute(select(Item.id, Item.categories, Item.features).where(Item.dataset_id == dataset_id))
    return [(int(i), c, f) for i, c, f in rows]


def public_similarities(session: Session, dataset_id: int) -> list[tuple[str, int, int, float]]:
    """(source name, item id, neighbour id, score) of every declared-public source of the data set."""
    rows = session.execute(
        select(SimilaritySource.name, ItemSimilarity.item_id, ItemSimilarity.neighbour_id, ItemSimilarity.score)
        .join(SimilaritySource, SimilaritySource.id == ItemSimilarity.source_id)
        .where(SimilaritySource.dataset_id == dataset_id, SimilaritySource.declared_public.is_(True))
    )
    return [(str(n), int(i), int(k), float(s)) for n, i, k, s in rows]


# ----------------------------------------------------------------------------- similarity sources
def source(session: Session, dataset_id: int, name: str, *, lock: bool = False) -> SimilaritySource | None:
    """The data set's similarity source ``name``, optionally row-locked (uploads to it serialise)."""
    stmt = select(SimilaritySource).where(SimilaritySource.dataset_id == dataset_id, SimilaritySource.name == name)
    return session.scalar(stmt.with_for_update() if lock else stmt)


def source_counts(session: Session, source_id: int) -> tuple[int, int]:
    """(pairs, distinct items with a list) of one source."""
    n_pairs, n_items = session.execute(
        select(func.count(), func.count(func.distinct(ItemSimilarity.item_id))).where(ItemSimilarity.source_id == source_id)
    ).one()
    return int(n_pairs), int(n_items)


def sources_page(session: Session, dataset_id: int, offset: int, limit: int) -> tuple[list[SimilaritySource], int]:
    """One page of the data set's similarity sources by name, and their total count."""
    where = SimilaritySource.dataset_id == dataset_id
    total = session.scalar(select(func.count()).select_from(SimilaritySource).where(where)) or 0
    rows = session.scalars(select(SimilaritySource).where(where).order_by(SimilaritySource.name)
                           .offset(offset).limit(limit)).all()
    return list(rows), int(total)


def delete_source(session: Session, src: SimilaritySource) -> int:
    """Delete a source and its lists; the pairs removed."""
    removed = rows_matched(session.execute(delete(ItemSimilarity).where(ItemSimilarity.source_id == src.id)))
    session.delete(src)
    session.flush()
    return int(removed)


def replace_lists(session: Session, source_id: int, owners: Sequence[int], pairs: Sequence[dict[str, Any]]) -> int:
    """Delete the lists of the items ``owners`` in a source and insert ``pairs``; the pairs removed."""
    removed = 0
    for part in chunks(owners):
        removed += rows_matched(session.execute(delete(ItemSimilarity).where(
            ItemSimilarity.source_id == source_id, ItemSimilarity.item_id.in_(part))))
    for chunk in chunks(pairs):
        session.execute(table_of(ItemSimilarity).insert(), list(chunk))
    return int(removed)


def neighbour_list(session: Session, source_id: int, item_id: int) -> list[tuple[str, float]]:
    """One item's stored list in a source: (neighbour's external id, score), best score first."""
    rows = session.execute(
        select(Item.external_id, ItemSimilarity.score).join(Item, Item.id == ItemSimilarity.neighbour_id)
        .where(ItemSimilarity.source_id == source_id, ItemSimilarity.item_id == item_id)
        .order_by(ItemSimilarity.score.desc(), Item.external_id))
    return [(str(e), float(s)) for e, s in rows]


# ----------------------------------------------------------------------------- public users
def lock_consent(session: Session, dataset_id: int, user_id: int) -> PublicRatingConsent | None:
    """Lock the user's row (their changes serialise) and return their consent row, locked too."""
    session.scalar(select(User.id).where(User.id == user_id).with_for_update())
    return session.get(PublicRatingConsent, (dataset_id, user_id), with_for_update=True)


def consent(session: Session, dataset_id: int, user_id: str) -> PublicRatingConsent | None:
    """The consent row of external user ``user_id``, if any."""
    return session.scalar(select(PublicRatingConsent).join(User, User.id == PublicRatingConsent.user_id)
                          .where(PublicRatingConsent.dataset_id == dataset_id, User.external_id == user_id))


def public_users_page(session: Session, dataset_id: int, offset: int,
                      limit: int) -> tuple[list[tuple[str, datetime]], int]:
    """(external user id, since) of users whose ratings are public now, by user id; and their count."""
    base = (select(User.external_id, PublicRatingConsent.updated_at).join(User, User.id == PublicRatingConsent.user_id)
            .where(PublicRatingConsent.dataset_id == dataset_id, PublicRatingConsent.public.is_(True)))
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    rows = session.execute(base.order_by(User.external_id).offset(offset).limit(limit)).all()
    return [(str(e), t) for e, t in rows], int(total)


def consent_events_page(session: Session, dataset_id: int, offset: int, limit: int,
                        user_id: str | None = None) -> tuple[list[tuple[int, str, bool, str, datetime]], int]:
    """The consent audit trail, oldest first, optionally of one user: (id, user, public, actor, at)."""
    E = PublicRatingConsentEvent
    base = select(E.id, User.external_id, E.public, E.actor, E.created_at).join(User, User.id == E.user_id).where(
        E.dataset_id == dataset_id)
    if user_id is not None:
        base = base.where(User.external_id == user_id)
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    rows = session.execute(base.order_by(E.id).offset(offset).limit(limit)).all()
    return [(int(i), str(u), bool(p), str(a), t) for i, u, p, a, t in rows], int(total)
