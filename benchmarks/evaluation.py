"""Evaluation protocols shared by the quality suites (docs/algorithms.md §1, "Evaluation protocols").

User embeddings are always computed exactly like the privileged endpoint computes them: from the
published model plus the user's own ratings only (``app.core.mf.foldin.fold_in_users``).
"""

from __future__ import annotations

import numpy as np

from app.core.data.ratings import Ratings
from app.core.data.splits import HeldoutSet
from app.core.eval.metrics import factor_predictions, ranking_metrics, rating_rmse
from app.core.mf.foldin import fold_in_users, is_ranking, user_offsets
from app.core.mf.model import PublicModel


def model_rmse(
    model: PublicModel,
    history: Ratings,
    test: Ratings,
    *,
    clip: tuple[float, float] | None = None,
) -> float:
    """Test RMSE of the served prediction m̃ + b_u + b̃_j + u·v_j, users re-projected from
    ``history``; untrained items (v_j = 0) get the baseline m̃ + b_u + b̃_j, as the service does."""
    users = fold_in_users(model, history)
    rows, cols, _ = test.coo()
    offsets = user_offsets(model, history)[rows] + model.item_biases[cols]
    predictions = factor_predictions(test, users, model.item_factors) + offsets
    return rating_rmse(test, predictions, train=history, clip=clip)


def model_ranking(model: PublicModel, heldout: HeldoutSet, k: int = 20) -> dict:
    """Recall@k / NDCG@k of held-out users folded in from their query (history excluded)."""
    users = fold_in_users(model, heldout.query)
    offsets = user_offsets(model, heldout.query)
    factors, mask = model.item_factors, model.trained_mask

    def scores(rows: np.ndarray) -> np.ndarray:
        block = offsets[rows, None] + model.item_biases + users[rows] @ factors.T
        if not is_ranking(model):
            block[:, ~mask] = -np.inf  # untrained items are ranked last (a ranking model keeps its prior)
        return block

    return ranking_metrics(scores, heldout.target, heldout.query, k)
