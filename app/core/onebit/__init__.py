"""One-bit (thumbs up/down) matrix completion with differential privacy (Li, Wei, Huang, Mao &
Wang, arXiv:2110.00719; docs/algorithms.md §4).

links: link functions and stable likelihoods; solver: nuclear-ball projections and solvers;
privacy: config, user-level events, calibration; train: mechanisms, model, privileged fit, artifact.
"""

from app.core.onebit.privacy import (
    MAX_ENTRIES,
    MECHANISMS,
    OneBitConfig,
    calibrate,
    check_public_shape,
    event_parameters,
    flip_probability,
    local_randomisation_event,
    onebit_event,
    public_config,
    randomize_votes,
)
from app.core.onebit.train import (
    OneBitModel,
    fit_user,
    load_onebit,
    recommend_onebit,
    save_onebit,
    train_onebit,
    train_with_estimate,
    user_scores,
)

__all__ = [
    "MAX_ENTRIES", "MECHANISMS", "OneBitConfig", "OneBitModel", "calibrate", "check_public_shape",
    "event_parameters",
    "fit_user", "flip_probability", "load_onebit", "local_randomisation_event", "onebit_event",
    "public_config", "randomize_votes", "recommend_onebit", "save_onebit", "train_onebit",
    "train_with_estimate", "user_scores",
]
