"""Public data for DP-CMF (docs/algorithms.md §3): item metadata tokens, public item-item similarities and
public users (who opted in to making their ratings public).

Public sources must never be derived from private users' data. The product enforces what it can:

* a similarity source must declare that it is public (``declared_public`` true, checked by the
  schema and by the database) and say where it comes from (non-empty ``provenance``);
* a user's public flag is set by that user's own token only (checked by the API); every change is
  appended to an audit trail and bumps the data set's ``ratings_version``;
* training removes public users' rows from the private ratings before any private statistic
  (:func:`app.core.mf.dpcmf.split_public_users`).

Metadata tokens (:func:`item_tokens`, from an item's public categories and features) are defined
in :mod:`app.core.data.item_tokens`; training reads these inputs through :mod:`app.db.loaders`.

Functions never commit; the caller does. Invalid input raises a ``PrivrecError`` before anything
is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.core.data.item_tokens import MIN_TOKEN_ITEMS, item_tokens
from app.db.models import (
    Dataset,
    PublicRatingConsent,
    PublicRatingConsentEvent,
    SimilaritySource,
    bump_ratings_version,
    utcnow,
)
from app.db.stores import public_inputs as store
from app.errors import (
    BatchTooLarge,
    InvalidRows,
    InvalidSourceName,
    NotDeclaredPublic,
    ProvenanceRequired,
    UnknownItem,
    UnknownSimilaritySource,
)
from app.schemas.common import MAX_BATCH_ROWS, Page
from app.schemas.public_data import (
    MAX_NEIGHBOURS,
    MAX_PAIRS_PER_BATCH,
    ConsentEventOut,
    Neighbour,
    NeighbourBatchOut,
    NeighbourRowError,
    NeighboursOut,
    PublicRatingsOut,
    PublicUserOut,
    SimilaritySourceOut,
)
from app.services.catalog import get_dataset, item_row_ids
from app.services.ingest import ensure_user_rows

__all__ = [
    "MIN_TOKEN_ITEMS",
    "item_tokens",
    "put_similarity_source",
    "get_similarity_source",
    "similarity_sources_page",
    "delete_similarity_source",
    "replace_neighbours",
    "item_neighbours",
    "set_public_ratings",
    "get_public_ratings",
    "public_users_page",
    "consent_events_page",
]

SOURCE_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")

NeighbourList = Sequence[tuple[str, float]]


# ---------------------------------------------------------------------------- similarity sources
def _source_row(session: Session, ds: Dataset, name: str, *, lock: bool = False) -> SimilaritySource:
    src = store.source(session, ds.id, name, lock=lock)
    if src is None:
        raise UnknownSimilaritySource(f"unknown similarity source {name!r} in data set {ds.name!r}",
                                      details={"source": name})
    return src


def _source_out(session: Session, src: SimilaritySource) -> SimilaritySourceOut:
    n_pairs, n_items = store.source_counts(session, src.id)
    return SimilaritySourceOut(name=src.name, provenance=src.provenance, declared_public=bool(src.declared_public),
                               created_by=src.created_by, created_at=src.created_at, updated_at=src.updated_at,
                               n_items=int(n_items), n_pairs=int(n_pairs))


def put_similarity_source(session: Session, *, dataset: str, name: str, provenance: str,
                          declared_public: bool, actor: str) -> tuple[SimilaritySourceOut, bool]:
    """Create a source or update its provenance; return (the source, whether it was created).

    422 unless ``declared_public`` is true and ``provenance`` is non-empty.
    """
    provenance = (provenance or "").strip()
    if not SOURCE_NAME.fullmatch(name):
        raise InvalidSourceName("a source name has 1-64 characters of [A-Za-z0-9_-]",
                                details={"source": name})
    if declared_public is not True:
        raise NotDeclaredPublic("a similarity source must declare that it is public (declared_public: true): "
                                "similarities derived from private users' ratings are not allowed")
    if not provenance:
        raise ProvenanceRequired("a similarity source needs a provenance (URL or citation)")
    ds = get_dataset(session, dataset)
    src = store.source(session, ds.id, name, lock=True)
    created = src is None
    if src is None:
        src = SimilaritySource(dataset_id=ds.id, name=name, provenance=provenance, declared_public=True,
                               created_by=actor)
        session.add(src)
    elif src.provenance != provenance:
        src.provenance = provenance
        src.updated_at = utcnow()
    session.flush()
    return _source_out(session, src), created


def get_similarity_source(session: Session, *, dataset: str, name: str) -> SimilaritySourceOut:
    """One source with its counts (404 when unknown)."""
    return _source_out(session, _source_row(session, get_dataset(session, dataset), name))


def similarity_sources_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[SimilaritySourceOut]:
    """One page of a data set's similarity sources, by name."""
    ds = get_dataset(session, dataset)
    rows, total = store.sources_page(session, ds.id, offset, limit)
    return Page[SimilaritySourceOut].build([_source_out(session, r) for r in rows], total=total,
                                           offset=offset, limit=limit)


def delete_similarity_source(session: Session, *, dataset: str, name: str) -> int:
    """Delete a source and its neighbour lists; return the pairs removed."""
    ds = get_dataset(session, dataset)
    src = _source_row(session, ds, name, lock=True)
    removed = store.delete_source(session, src)
    if removed:
        bump_ratings_version(session, ds.id, n=1)
    return removed


def _check_sizes(rows: Sequence[tuple[str, NeighbourList]], max_rows: int | None) -> None:
    n_pairs = sum(len(n) for _, n in rows)
    if max_rows is not None and len(rows) > max_rows:
        raise BatchTooLarge(f"an upload holds at most {max_rows} rows; got {len(rows)}",
                            details={"max_rows": max_rows, "rows": len(rows)})
    if max_rows is not None and n_pairs > MAX_PAIRS_PER_BATCH:
        raise BatchTooLarge(f"an upload holds at most {MAX_PAIRS_PER_BATCH} pairs; got {n_pairs}",
                            details={"max_pairs": MAX_PAIRS_PER_BATCH, "pairs": n_pairs})


def _row_error(item: str, neighbours: NeighbourList, item_map: dict[str, int], first: int, k: int) -> str | None:
    """Why row ``k`` (item ``item`` with ``neighbours``) is invalid, or None."""
    if first != k:
        return f"item repeated; first at row {first}"
    if item not in item_map:
        return f"unknown item {item!r}"
    if len(neighbours) > MAX_NEIGHBOURS:
        return f"{len(neighbours)} neighbours; at most {MAX_NEIGHBOURS} per item"
    seen: set[str] = set()
    for other, score in neighbours:
        if other == item:
            return "an item cannot be its own neighbour"
        if other in seen:
            return f"neighbour {other!r} repeated"
        seen.add(other)
        if other not in item_map:
            return f"unknown neighbour {other!r}"
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            return f"score of neighbour {other!r} must be a finite number"
    return None


def _validate_rows(rows: Sequence[tuple[str, NeighbourList]], item_map: dict[str, int]) -> None:
    """422 with per-row errors (nothing written) when any row is invalid."""
    first: dict[str, int] = {}
    errors: list[NeighbourRowError] = []
    for k, (item, neighbours) in enumerate(rows):
        msg = _row_error(item, neighbours, item_map, first.setdefault(item, k), k)
        if msg is not None:
            errors.append(NeighbourRowError(index=k, item_id=item, error=msg))
    if errors:
        raise InvalidRows(f"{len(errors)} of {len(rows)} rows are invalid; nothing was written",
                          details={"rows": [e.model_dump() for e in errors[:1000]], "n_invalid": len(errors)})


def replace_neighbours(session: Session, *, dataset: str, source: str,
                       rows: Sequence[tuple[str, NeighbourList]], max_rows: int | None = MAX_BATCH_ROWS) -> NeighbourBatchOut:
    """Replace the neighbour lists of the items in ``rows`` (item id, [(neighbour id, score)]), all or nothing.

    Idempotent: each row replaces that item's whole top-K list in ``source`` (an empty list clears
    it). ``max_rows`` caps the upload (413; None: no cap, for the CLI). 422 with per-row errors when
    any row is invalid. Bumps the data set's ``ratings_version``.
    """
    ds = get_dataset(session, dataset)
    src = _source_row(session, ds, source, lock=True)  # serialises uploads to one source
    _check_sizes(rows, max_rows)
    ids = sorted({item for item, _ in rows} | {other for _, n in rows for other, _ in n})
    item_map = item_row_ids(session, ds, ids)
    _validate_rows(rows, item_map)
    owners = [item_map[item] for item, _ in rows]
    pairs = [{"source_id": src.id, "item_id": item_map[item], "neighbour_id": item_map[other], "score": float(score)}
             for item, neighbours in rows for other, score in neighbours]
    removed = store.replace_lists(session, src.id, owners, pairs)
    src.updated_at = utcnow()
    bump_ratings_version(session, ds.id, n=1)
    session.flush()
    return NeighbourBatchOut(source=source, items=len(rows), pairs_written=len(pairs), pairs_removed=int(removed))


def item_neighbours(session: Session, *, dataset: str, source: str, item_id: str) -> NeighboursOut:
    """One item's stored neighbour list in ``source``, best score first (404 unknown item)."""
    ds = get_dataset(session, dataset)
    src = _source_row(session, ds, source)
    iid = item_row_ids(session, ds, [item_id]).get(item_id)
    if iid is None:
        raise UnknownItem(f"unknown item {item_id!r}", details={"item_id": item_id})
    rows = store.neighbour_list(session, src.id, iid)
    return NeighboursOut(source=source, item_id=item_id, neighbours=[Neighbour(item_id=e, score=s) for e, s in rows])


# ---------------------------------------------------------------------------- public users
def _consent_out(ds: Dataset, user_id: str, row: PublicRatingConsent | None, changed: bool) -> PublicRatingsOut:
    return PublicRatingsOut(dataset=ds.name, user_id=user_id, public=bool(row.public) if row else False,
                            changed=changed, updated_at=row.updated_at if row else None)


def set_public_ratings(session: Session, *, dataset: str, user_id: str, public: bool, actor: str) -> PublicRatingsOut:
    """Record the user's choice; a change is audited and bumps ``ratings_version``.

    The caller has checked that ``actor`` is the user themself (their own token).
    """
    ds = get_dataset(session, dataset)
    now = utcnow()
    uid = ensure_user_rows(session, [user_id], now)[user_id]
    row = store.lock_consent(session, ds.id, uid)  # serialises this user's changes
    if row is not None and bool(row.public) == bool(public):
        return _consent_out(ds, user_id, row, changed=False)
    if row is None:
        row = PublicRatingConsent(dataset_id=ds.id, user_id=uid, public=bool(public), updated_at=now)
        session.add(row)
    else:
        row.public, row.updated_at = bool(public), now
    session.add(PublicRatingConsentEvent(dataset_id=ds.id, user_id=uid, public=bool(public), actor=actor, created_at=now))
    bump_ratings_version(session, ds.id, n=1)
    session.flush()
    return _consent_out(ds, user_id, row, changed=True)


def get_public_ratings(session: Session, *, dataset: str, user_id: str) -> PublicRatingsOut:
    """The user's current choice (false when never set)."""
    ds = get_dataset(session, dataset)
    row = store.consent(session, ds.id, user_id)
    return _consent_out(ds, user_id, row, changed=False)


def public_users_page(session: Session, *, dataset: str, offset: int, limit: int) -> Page[PublicUserOut]:
    """Users whose ratings of ``dataset`` are public now (by their own choice), by user id."""
    ds = get_dataset(session, dataset)
    rows, total = store.public_users_page(session, ds.id, offset, limit)
    items = [PublicUserOut(user_id=e, public=True, updated_at=t) for e, t in rows]
    return Page[PublicUserOut].build(items, total=total, offset=offset, limit=limit)


def consent_events_page(session: Session, *, dataset: str, offset: int, limit: int,
                        user_id: str | None = None) -> Page[ConsentEventOut]:
    """The consent audit trail (oldest first), optionally for one user."""
    ds = get_dataset(session, dataset)
    rows, total = store.consent_events_page(session, ds.id, offset, limit, user_id)
    items = [ConsentEventOut(id=i, user_id=u, public=p, actor=a, created_at=t) for i, u, p, a, t in rows]
    return Page[ConsentEventOut].build(items, total=total, offset=offset, limit=limit)
