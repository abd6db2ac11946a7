"""What each algorithm trains on, read from the database in one transaction.

An algorithm's ``data`` kind (``app.core.algorithms.Algorithm.data``) names its inputs:

* ``"ratings"``: the data set's ratings as a :class:`Ratings` (items = every item of the data set);
* ``"ratings+public"`` (DP-CMF): the private ratings without public users' rows, plus the public
  item data (metadata tokens, public similarities, public users' ratings) as ``public=``;
* ``"votes"`` (one-bit mechanisms): the thumbs up/down votes as a :class:`Ratings` of +-1.

Each loader returns ``(data, extra keyword arguments for Algorithm.train)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from app.core.algorithms import Algorithm
from app.core.data.ratings import Ratings
from app.db.models import Dataset
from app.services.bulk_read import load_ratings
from app.services.public_data import load_ratings_and_public
from app.services.votes import load_votes

__all__ = ["load_training_inputs", "DATA_KINDS"]

Loader = Callable[[Session, Dataset], tuple[Ratings, dict[str, Any]]]
DATA_KINDS = ("ratings", "ratings+public", "votes")


def _load_ratings_only(session: Session, ds: Dataset) -> tuple[Ratings, dict[str, Any]]:
    return load_ratings(session, ds), {}


_LOADERS: dict[str, Loader] = {
    "ratings": _load_ratings_only,
    "ratings+public": load_ratings_and_public,
    "votes": load_votes,
}


def load_training_inputs(session: Session, ds: Dataset, algo: Algorithm, *,
                         local_epsilon: float | None = None) -> tuple[Ratings, dict[str, Any]]:
    """The training data of ``algo`` on ``ds`` and the extra keyword arguments of its ``train``.

    ``local_epsilon`` (votes only): read only the bits randomised at ingestion with exactly this
    ε0 (a free, pre-randomised run); any other row is never read.
    """
    kind = getattr(algo, "data", "ratings")
    if local_epsilon is not None:
        if kind != "votes":
            raise ValueError("local_epsilon filters votes only")
        return load_votes(session, ds, local_epsilon=local_epsilon)
    if kind not in _LOADERS:
        raise ValueError(f"unknown training data kind {kind!r}; known: {DATA_KINDS}")
    return _LOADERS[kind](session, ds)
