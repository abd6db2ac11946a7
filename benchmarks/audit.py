"""Suite ``audit``: an empirical lower bound on ε per release, next to the claimed ε.

The one-run audit of Steinke, Nasr and Jagielski 2023 (arXiv:2305.08846, Algorithm 1, Theorem 3.3
and Proposition 5.7), white-box: canary users are each included in the training data independently
with probability 1/2; after the run every canary gets a score from the release it targets, the
auditor guesses "included" for the k₊ highest scores and "excluded" for the k₋ lowest (abstaining on
the rest), and W correct guesses out of r give the largest ε an (ε, δ)-DP run could not explain: if
the run is (ε, δ)-DP, P[W >= v] <= P[Binomial(r, e^ε/(1 + e^ε)) >= v] + 2mδ·α(v). Every bound is a
95 % lower bound (Bonferroni over the guess sizes tried); as in jax-privacy's auditing module, the
scores are the only link between the run and the bound.

**What is audited.** The service's default configuration: the hyper-parameters the ``Algorithm``
registry (``app.core.algorithms``) resolves for an admin's request without hyper-parameters, for the
canary data set's declared size, calibrated to the claimed ε and re-read with a seed as the training
worker does. The claimed ε is the ledger's RDP figure of the run's event.

**One canary family per release** of each audited algorithm's default run (checked against the
run's own release record): DPALS and DP-CMF (whose public item data adds no release; their default
first releases a count histogram that sets the contribution bound k, issue 27), DPFW (its
dense eigen-step, the default below ``dense_max_items``) and one-bit (InP, its default mechanism,
on a data set that stores raw votes). Each per-item family's canaries rate ``CANARY_ITEMS`` items of
their own (items nobody else rates) 5 and 60 base items neutrally, so the sum of (r − midpoint) over
a canary is 0 and its count 64; the score reads the targeted release's output, recorded by the
test-only :func:`app.core.privacy.releaser.audit_tap`:

- ``item_counts``, ``item_bias_sums``: the released value summed over the canary's items;
- ``item_recounts``, ``item_grams`` (trace of Ã_j), ``item_linear`` (‖b̃_j‖²): summed over the
  canary's items in the released frequent set and over the steps; a canary none of whose items is
  frequent abstains;
- DPFW's ``gram``: the diagonal of the released Ŵ on the canary's items, summed over the steps;
- one-bit's ``vote_flips``: vote canaries vote on ``CANARY_ITEMS`` items of their own, all +1
  ("included") or all −1 (InP hides vote values, not who voted); the score is the sum of their
  randomised bits. The non-default mechanisms (:data:`VARIANTS`) use the same canaries: GraP's
  ``grap_gradient`` scores minus the released gradients' column sums on the canary's items (a +1
  vote's loss gradient is negative), OutP's ``outp_matrix`` the released X's column sums there, and
  ObjP's ``objp_objective_noise`` (its objective perturbation B switched off) the column sums of
  its released X_T + Z.

The **scalar releases** and the **count histogram** decode: every canary of such a family moves the
release by a known amount of its own, and the auditor knows the rest of the data (it conditions on
every other family's canaries too), so the release minus the known rest spells the included set
while the release's grid step stays below one unit (checked); every canary is guessed (r = m):

- ``user_mean_sum`` (Σ over users of each one's mean offset, the default ``mean_mode`` "dp_user"):
  canary i of ``USER_MEAN_CANARIES`` = 6 has the mean offset (h/32)·2^i (2^(4−i) base items at 3 but
  one at 4; canary 5 one rating of 5), so the residual in units of h/32 is the included set in binary;
- ``user_count`` (one per user whatever her ratings): one canary a run (one rating at 3), read off
  the residual 0 or 1; a single bit a run cannot beat ε = 1, so this family pools ``RUN_FACTOR`` = 6
  times as many worlds (18 canaries, as the other scalar families);
- ``bound_histogram`` (users per power-of-two bin of their number of ratings, the first release
  with ``bound_quantile`` set): canary b of ``HISTOGRAM_CANARIES`` = 7 rates 2^b base items at 3,
  the only canary of the family in bin b = [2^b, 2^(b+1)), so the residual of bin b is its bit.
  The bound k read off this release is data-dependent; in the fixed worlds 0–2 it comes out between
  78 and 145 (the 0.75-quantile of ≈ 24 and 64 ratings a user), above the item canaries' 64
  ratings, so their ratings are all sampled and the item families keep their power (a smaller k
  would weaken those families, never the validity of a bound: the claim is the whole run's);
- ``mean_sum``, ``mean_count`` (the per-rating mean, ``mean_mode`` "dp", no longer in the default
  run): audited as the variant ``dpals-dp-mean``, whose bound law is pinned (``bound_min`` = the
  largest k, 240: every canary's ratings sampled; its other releases are audited there again).
  Canary i of ``MEAN_CANARIES`` = 6 rates 2^i base items 5, adding 2^i to the count and 2^(i+1) to
  the sum of (r − midpoint): the residuals (the sum's halved) spell the included set in binary.

A handful of canaries a run is too few for a bound above 1, so each configuration is run ``RUNS``
times on fresh canary worlds and every family pools its canaries over the runs (each canary lives in
one run, so the pooled test is still a test of each run's (ε, δ)-DP).

The test-only hook switches off the noise of one named release (``noise_off``): a context variable,
never a parameter, not reachable from the API, settings or a stored config. A release with its noise
off must give a bound above its claim; every honest run must stay at or below it.

DPFW's Oja path (its default above ``dense_max_items`` = 2000 items) is audited as ``dpfw-oja`` on a
catalogue padded to 2100 items: ``oja_product`` scores Σ |(AᵀA v + g)_j| over the canary's items and
the iterations. Not audited yet: its scalar ``oja_eigenvalue`` ‖A v̂‖² (a canary's share,
(A_i·v̂)², is far below that release's grid step unless its row aligns with v̂, and decoding it needs
every user's local state replayed), ObjP's output Gaussian Z (``objp_output``: it covers only the
solver's ρ = 1e-6 slack, the objective noise B carries the privacy, so switching Z off alone is not
caught — measured: 0.00 — and is not meant to be) and the randomisation at ingestion (the same
``randomize_votes``, called by the votes service).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import numpy as np
from scipy import stats

from app.core.algorithms import get_algorithm, resolve_hyperparameters
from app.core.data.ratings import Ratings
from app.core.mf.defaults import RATING_BOUND
from app.core.mf.dpals import DPALSConfig, count_floor, frequent_items
from app.core.mf.dpcmf import PublicData, metadata_source
from app.core.privacy import accounting
from app.core.privacy.releaser import AuditTap, audit_tap
from benchmarks.harness import limit_threads, make_row

SUITE = "audit"
DELTA = 1e-6
CONFIDENCE = 0.05  # 95 % lower bounds
GUESS_FRACTIONS = (0.1, 0.25, 0.4)  # k₊ = k₋ = fraction·(canaries that do not abstain); Bonferroni over these
RATING_RANGE = (1.0, 5.0)
MIDPOINT = 3.0

BASE_USERS, BASE_ITEMS = 200, 80
VOTE_BASE_USERS, VOTE_BASE_ITEMS = 40, 20  # one-bit solves a dense user_rows × items matrix: kept small
CANARIES_PER_FAMILY = 32  # per run, per item family
CANARY_ITEMS = 4  # own items per canary
CANARY_RATINGS = 64  # ratings per item-family canary (within every bound k the fixed worlds release)
MEAN_CANARIES = 6  # per run: 2^0 .. 2^5 ratings, 63 < CANARY_RATINGS in all
USER_MEAN_CANARIES = 6  # per run: mean offsets (h/32)·2^0 .. (h/32)·2^5 = h
HISTOGRAM_CANARIES = 7  # per run: canary b rates 2^b base items, in bin b of the count histogram
COUNT_CANARIES = 1  # per run: a user adds 1 to the user count whatever her ratings
RUNS = 3  # canary worlds per configuration
RUN_FACTOR = {"user_count": 6}  # a family with fewer canaries a run runs on RUN_FACTOR times the worlds

ITEM_FAMILIES = ("item_counts", "item_bias_sums", "item_recounts", "item_grams", "item_linear")
DPALS_RELEASES = ("bound_histogram", "item_counts", "user_mean_sum", "user_count", "item_bias_sums", "item_recounts",
                  "item_grams", "item_linear")
DPALS_DP_MEAN_RELEASES = ("bound_histogram", "item_counts", "mean_sum", "mean_count", "item_bias_sums", "item_recounts",
                          "item_grams", "item_linear")
#: the canaries a scalar (or histogram) family decodes: family -> (canary group, canaries per run)
DECODED: dict[str, tuple[str, int]] = {"mean_sum": ("mean", MEAN_CANARIES), "mean_count": ("mean", MEAN_CANARIES),
                                       "user_mean_sum": ("user_mean", USER_MEAN_CANARIES),
                                       "user_count": ("user_count", COUNT_CANARIES),
                                       "bound_histogram": ("bound_histogram", HISTOGRAM_CANARIES)}
#: every release of each audited algorithm's default run, each with its canary family (DP-CMF makes
#: DPALS's releases; DPFW's default at this catalogue size is the dense eigen-step)
RELEASES: dict[str, tuple[str, ...]] = {"dpals": DPALS_RELEASES, "dpals-dp-mean": DPALS_DP_MEAN_RELEASES,
                                        "dpcmf": DPALS_RELEASES,
                                        "dpfw": ("item_counts", "gram"), "dpfw-oja": ("item_counts", "oja_product"),
                                        "onebit": ("vote_flips",), "onebit-grap": ("grap_gradient",),
                                        "onebit-outp": ("outp_matrix",), "onebit-objp": ("objp_objective_noise",)}


@dataclass(frozen=True)
class Variant:
    """An audit of ``algorithm`` other than its default at the canary world's size: another
    catalogue size (items nobody rated pad it) or a non-default public choice."""

    algorithm: str
    catalogue: int = 0
    params: tuple[tuple[str, Any], ...] = ()


#: DPALS's per-rating DP mean (``mean_mode`` "dp", the default before issue 27) with its bound law
#: pinned (k = ``bound_min`` = the largest bound: the mean canaries' ratings all sampled) and the bias
#: prior as given (rule 13's law reads the user count that only "dp_user" releases); DPFW's
#: default eigen-step is private Oja above ``dense_max_items`` (2000) items; one-bit's non-default
#: mechanisms GraP, OutP and ObjP
VARIANTS: dict[str, Variant] = {"dpals-dp-mean": Variant("dpals", params=(("mean_mode", "dp"),
                                                                          ("bound_min", RATING_BOUND["largest"]),
                                                                          ("item_bias_prior_by_users", False))),
                                "dpfw-oja": Variant("dpfw", catalogue=2100),
                                "onebit-grap": Variant("onebit", params=(("mechanism", "grap"),)),
                                "onebit-outp": Variant("onebit", params=(("mechanism", "outp"),)),
                                "onebit-objp": Variant("onebit", params=(("mechanism", "objp"),))}
#: releases a run makes that no family audits yet (and why: the module doc)
UNAUDITED: dict[str, tuple[str, ...]] = {"dpfw-oja": ("oja_eigenvalue",), "onebit-objp": ("objp_output",)}
GENRES = 5  # DP-CMF's public item metadata: item j has genre j mod GENRES (data-independent)


# ---------------------------------------------------------------------------- the bound
def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[>= v of r guesses correct] under an (ε, δ)-DP null (SNJ 2023 Thm 3.3 with the δ term)."""
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomised response
    beta = float(stats.binom.sf(v - 1, r, q))
    if v == 0 or delta == 0:
        return min(1.0, beta)
    steps = np.arange(1, v + 1)  # α = max_i P[v > Binomial(r, q) >= v − i] / i
    alpha = float(np.max(np.cumsum(stats.binom.pmf(v - steps, r, q)) / steps))
    return min(1.0, beta + 2.0 * m * delta * alpha)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, level: float = CONFIDENCE) -> float:
    """The largest ε whose null hypothesis the observation (v of r correct) rejects at ``level``."""
    if r == 0 or p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    low, high = 0.0, 1.0  # p(low) < level; find high with p(high) >= level
    while p_value(m, r, v, high, delta) < level:
        low, high = high, 2.0 * high
    for _ in range(40):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if p_value(m, r, v, middle, delta) < level else (low, middle)
    return low


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float
    guesses: int
    correct: int
    canaries: int


def one_run_audit(scores: np.ndarray, included: np.ndarray, delta: float = DELTA) -> AuditResult:
    """Guess the top/bottom scores at each guess size; the best Bonferroni-corrected 95 % bound.
    A NaN score abstains (it is in neither guess set)."""
    scores = np.asarray(scores, dtype=np.float64)
    m = len(scores)
    ranked = np.flatnonzero(~np.isnan(scores))
    order = ranked[np.argsort(-scores[ranked], kind="stable")]
    best = AuditResult(0.0, 0, 0, m)
    level = CONFIDENCE / len(GUESS_FRACTIONS)
    for fraction in GUESS_FRACTIONS:
        k = max(1, int(fraction * len(order)))
        if 2 * k > len(order):
            continue
        correct = int(included[order[:k]].sum() + (~included[order[len(order) - k:]]).sum())
        bound = epsilon_lower_bound(m, 2 * k, correct, delta, level)
        if bound > best.epsilon_lower_bound:
            best = AuditResult(bound, 2 * k, correct, m)
    return best


def decoded_audit(guessed: np.ndarray, included: np.ndarray, delta: float = DELTA) -> AuditResult:
    """A guess for every canary (r = m): the decoded inclusion bits of a scalar release."""
    m = len(included)
    correct = int((np.asarray(guessed, dtype=bool) == included).sum())
    return AuditResult(epsilon_lower_bound(m, m, correct, delta), m, correct, m)


# ---------------------------------------------------------------------------- the canary world
@dataclass(frozen=True)
class CanaryWorld:
    """Base ratings plus every family's canaries (each included with probability 1/2)."""

    ratings: Ratings
    own_items: dict[str, np.ndarray]  # item family -> (m, CANARY_ITEMS) item indices
    included: dict[str, np.ndarray]  # family or canary group -> (m,) bool
    canary_users: dict[str, np.ndarray]  # the same keys -> (m,) user ids (included or not)
    max_users: int  # the data set's declared bound on users: every canary's slot, included or not


def _base_ratings(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    truth = rng.normal(size=(BASE_USERS, 3)) @ rng.normal(size=(BASE_ITEMS, 3)).T * 0.6 + MIDPOINT
    users, items = np.nonzero(rng.random((BASE_USERS, BASE_ITEMS)) < 0.3)
    return users, items, np.clip(np.rint(truth[users, items]), *RATING_RANGE)


def _item_canary(rng: np.random.Generator, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(items, values): its own items at 5, CANARY_RATINGS − len(own) base items of which 2·len(own)
    at 2 and the rest at 3, so Σ (r − 3) = 0 and the count is CANARY_RATINGS."""
    anchors = rng.choice(BASE_ITEMS, size=CANARY_RATINGS - len(own), replace=False)
    values = np.full(len(anchors), MIDPOINT)
    values[: 2 * len(own)] = MIDPOINT - 1.0
    return np.concatenate([own, anchors]), np.concatenate([np.full(len(own), RATING_RANGE[1]), values])


def _decoded_canary(group: str, i: int) -> np.ndarray:
    """The ratings (values, on distinct base items) of canary ``i`` of a decoded family's ``group``:

    - ``mean`` (``mean_sum``, ``mean_count``): 2^i ratings of 5, so 2^i to the count, 2^(i+1) to Σ (r − 3);
    - ``user_mean`` (``user_mean_sum``): a mean offset of (h/32)·2^i: 2^(4−i) ratings (one if i >= 4)
      at 3 but the first, at 4 (i <= 4) or 5 (i = 5);
    - ``bound_histogram``: 2^i ratings at 3, a count in bin i = [2^i, 2^(i+1)) of the histogram;
    - ``user_count``: one rating at 3.
    """
    if group == "mean":
        return np.full(2**i, RATING_RANGE[1])
    if group == "user_mean":
        n = 2 ** max(0, USER_MEAN_CANARIES - 2 - i)
        values = np.full(n, MIDPOINT)
        values[0] += n * _user_mean_unit() * 2**i
        return values
    return np.full(2**i if group == "bound_histogram" else 1, MIDPOINT)


def _user_mean_unit() -> float:
    """The smallest user-mean canary's mean offset: h/32 (the largest's is h)."""
    return 0.5 * (RATING_RANGE[1] - RATING_RANGE[0]) / 2 ** (USER_MEAN_CANARIES - 1)


def canary_world(seed: int, families: tuple[str, ...] = DPALS_RELEASES, catalogue: int = 0) -> CanaryWorld:
    """One world: base ratings, ``CANARIES_PER_FAMILY`` canaries per item family and the canaries of
    each decoded group among ``families`` (:data:`DECODED`); the catalogue padded with unrated items
    to ``catalogue``."""
    rng = np.random.default_rng(seed)
    parts = [_base_ratings(rng)]
    own_items, included, canary_users = {}, {}, {}
    next_user, next_item = BASE_USERS, BASE_ITEMS
    for family in (f for f in families if f not in DECODED):
        own = next_item + np.arange(CANARIES_PER_FAMILY * CANARY_ITEMS).reshape(CANARIES_PER_FAMILY, CANARY_ITEMS)
        own_items[family], included[family] = own, rng.random(CANARIES_PER_FAMILY) < 0.5
        canary_users[family] = next_user + np.arange(CANARIES_PER_FAMILY)
        for i in np.flatnonzero(included[family]):
            rated, rating = _item_canary(rng, own[i])
            parts.append((np.full(len(rated), next_user + i), rated, rating))
        next_user, next_item = next_user + CANARIES_PER_FAMILY, next_item + own.size
    for group, m in dict(DECODED[f] for f in families if f in DECODED).items():
        included[group], canary_users[group] = rng.random(m) < 0.5, next_user + np.arange(m)
        for i in np.flatnonzero(included[group]):
            rating = _decoded_canary(group, int(i))
            rated = rng.choice(BASE_ITEMS, size=len(rating), replace=False)
            parts.append((np.full(len(rated), next_user + i), rated, rating))
        next_user += m
    ratings = Ratings.from_arrays(*(np.concatenate([part[k] for part in parts]) for k in range(3)),
                                  item_ids=np.arange(max(next_item, catalogue)), rating_range=RATING_RANGE)
    return CanaryWorld(ratings=ratings, own_items=own_items, included=included, canary_users=canary_users,
                       max_users=next_user)


def vote_world(seed: int, family: str = "vote_flips") -> CanaryWorld:
    """Votes: base voters' ±1 votes on the base items, and ``CANARIES_PER_FAMILY`` vote canaries
    that vote on ``CANARY_ITEMS`` items of their own, all +1 ("included") or all −1 with
    probability 1/2 each. InP protects vote values (replace-a-vote-value, at most
    ``votes_per_user`` of them per user), so a canary's secret is the sign of its votes."""
    rng = np.random.default_rng(seed)
    users, items = np.nonzero(rng.random((VOTE_BASE_USERS, VOTE_BASE_ITEMS)) < 0.3)
    values = np.where(rng.random(len(users)) < 0.6, 1.0, -1.0)
    own = VOTE_BASE_ITEMS + np.arange(CANARIES_PER_FAMILY * CANARY_ITEMS).reshape(CANARIES_PER_FAMILY, CANARY_ITEMS)
    included = rng.random(CANARIES_PER_FAMILY) < 0.5
    canary_votes = np.repeat(np.where(included, 1.0, -1.0), CANARY_ITEMS)
    votes = Ratings.from_arrays(np.concatenate([users, VOTE_BASE_USERS + np.arange(own.size) // CANARY_ITEMS]),
                                np.concatenate([items, own.ravel()]), np.concatenate([values, canary_votes]),
                                item_ids=np.arange(VOTE_BASE_ITEMS + own.size))
    return CanaryWorld(ratings=votes, own_items={family: own}, included={family: included},
                       canary_users={family: VOTE_BASE_USERS + np.arange(CANARIES_PER_FAMILY)},
                       max_users=VOTE_BASE_USERS + CANARIES_PER_FAMILY)


# ---------------------------------------------------------------------------- one run through the registry
def default_config(algorithm: str, epsilon: float, world: CanaryWorld, seed: int, choices: dict[str, Any] | None = None):
    """The config an admin's request without hyper-parameters runs: the registry's defaults for the
    data set's declared size (votes on a raw-votes data set: ``user_rows`` = the declared
    ``max_users``, as the service sets it), calibrated to (ε, DELTA), re-read with a seed as the
    training worker does (a fixed one here, so CI cannot flake)."""
    algo = get_algorithm(algorithm)
    n_items = world.ratings.n_items
    params, _ = resolve_hyperparameters(algorithm, {}, objective=None, epsilon=epsilon, delta=DELTA,
                                        rating_range=RATING_RANGE, n_items=n_items, max_users=world.max_users)
    if algo.data == "votes":
        params = {**params, "user_rows": world.max_users}
    params = {**params, **(choices or {})}
    config = algo.calibrate(epsilon, DELTA, algo.config_from_params(params, RATING_RANGE), n_items)
    return algo.config_from_dict({**algo.public_config(config), "seed": seed})


@dataclass(frozen=True)
class Run:
    """One audited training run: the world, its published model, its release record, the claim."""

    world: CanaryWorld
    trained: np.ndarray  # the items whose statistics the chunked releases hold (DPALS: the frequent set)
    tap: AuditTap
    claimed: float


def public_inputs(algorithm: str, world: CanaryWorld) -> dict[str, Any]:
    """The public training inputs beyond the ratings (DP-CMF: item metadata)."""
    if get_algorithm(algorithm).data != "ratings+public":
        return {}
    genres = [[f"genre-{j % GENRES}"] for j in range(world.ratings.n_items)]
    return {"public": PublicData((metadata_source(genres),))}


def train_run(name: str, epsilon: float, seed: int, noise_off: str | None = None) -> Run:
    """Train the algorithm of audit ``name`` (a registry name or a :data:`VARIANTS` key) on the world
    of ``seed`` with its default config (``noise_off``: the release drawn without noise, the
    negative control)."""
    variant = VARIANTS.get(name, Variant(name))
    algorithm, algo = variant.algorithm, get_algorithm(variant.algorithm)
    world = vote_world(seed, RELEASES[name][0]) if algo.data == "votes" else canary_world(seed, RELEASES[name], variant.catalogue)
    config = default_config(algorithm, epsilon, world, seed, dict(variant.params))
    with audit_tap(noise_off) as tap, limit_threads(1):  # small matrices: one BLAS thread is fastest
        model = algo.train(world.ratings, config, **public_inputs(algorithm, world))
    if noise_off is not None and not tap.switched_off:
        raise ValueError(f"{algorithm} made no release named {noise_off!r}")
    claimed = accounting.epsilon_rdp(algo.event(config, world.ratings.n_items), DELTA)
    fraction = getattr(config, "frequent_fraction", None)
    trained = (np.flatnonzero(model.trained_mask) if fraction is None else  # DP-CMF trains more than these
               frequent_items(np.maximum(tap.outputs["item_counts"][0], 1.0), fraction, _count_floor(model.config)))
    return Run(world=world, trained=trained, tap=tap, claimed=claimed)


def _count_floor(published: dict) -> float:
    """The run's count floor for its trained set (rule 10), from the DPALS part of its published config
    (the released B and the multipliers the run used)."""
    names = {f.name for f in fields(DPALSConfig)}
    return count_floor(DPALSConfig.from_dict({**{k: v for k, v in published.items() if k in names}, "seed": 0}))


# ---------------------------------------------------------------------------- scores per family
def _vector(run: Run, name: str) -> np.ndarray:
    (released,) = run.tap.outputs[name]
    return np.asarray(released, dtype=np.float64)


def _per_trained_item(run: Run, name: str, statistic: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Σ over steps of ``statistic`` of each trained item's released rows (chunked releases)."""
    total = np.zeros(len(run.trained))
    for positions, rows in run.tap.rows[name]:
        np.add.at(total, positions, statistic(rows))
    return total


def _on_trained(run: Run, family: str, per_position: np.ndarray) -> np.ndarray:
    """Each canary's sum over its trained items; NaN (abstain) where none is trained."""
    position = np.full(run.world.ratings.n_items, -1)
    position[run.trained] = np.arange(len(run.trained))
    at = position[run.world.own_items[family]]
    trained = at >= 0
    scores = np.where(trained, per_position[np.maximum(at, 0)], 0.0).sum(axis=1)
    return np.where(trained.any(axis=1), scores, np.nan)


def _per_item_total(run: Run, name: str, n_items: int) -> np.ndarray:
    """Σ of a release's values per item, from its (item column, value) record."""
    ((columns, values),) = run.tap.rows[name]
    return np.bincount(columns, weights=values, minlength=n_items)


def _diagonal_per_item(run: Run, name: str) -> np.ndarray:
    """Σ over steps of the diagonal of a released item × item matrix (DPFW's Ŵ)."""
    return np.sum([np.diagonal(matrix) for matrix in run.tap.outputs[name]], axis=0)


def _gram_trace(rows: np.ndarray) -> np.ndarray:
    return np.einsum("kii->k", rows)  # the diagonal is written whether or not the release mirrors


def _squared_norm(rows: np.ndarray) -> np.ndarray:
    return np.einsum("ki,ki->k", rows, rows)


def _decoded(residual: float, unit: float, grid: float, bits: int) -> np.ndarray:
    """The inclusion bits of ``bits`` canaries spelt in binary by a scalar release's residual (its
    unknown part), canary i adding 2^i units."""
    if not grid < unit:
        raise ValueError(f"the release's grid step {grid} does not resolve the canaries' unit {unit}")
    value = int(round(residual / unit)) % 2**bits
    return np.array([(value >> i) & 1 for i in range(bits)], dtype=bool)


def _rest(world: CanaryWorld, group: str) -> tuple[np.ndarray, np.ndarray]:
    """(number of ratings, Σ (r − midpoint)) of every user with a rating but ``group``'s canaries:
    the data the auditor knows (other families' canaries included: it may condition on them)."""
    rows, _, values = world.ratings.coo()
    kept = ~np.isin(world.ratings.user_ids[rows], world.canary_users[group])
    counts = np.bincount(rows[kept], minlength=world.ratings.n_users)
    sums = np.bincount(rows[kept], weights=values[kept] - MIDPOINT, minlength=world.ratings.n_users)
    return counts[counts > 0], sums[counts > 0]


def _decoded_bits(run: Run, family: str) -> np.ndarray:
    """A decoded family's guesses: every canary's inclusion bit read off the release minus the rest."""
    group, m = DECODED[family]
    counts, sums = _rest(run.world, group)
    released, grid = _vector(run, family), run.tap.grids[family]
    if family == "bound_histogram":  # canary b alone adds 1 to bin b (the last one open: [2^b, ∞) is fine)
        rest = np.bincount(np.minimum(np.floor(np.log2(counts)).astype(np.int64), len(released) - 1),
                           minlength=len(released))
        if not (grid < 0.5 and len(released) >= m):
            raise ValueError(f"the histogram (grid {grid}, {len(released)} bins) does not resolve {m} canary bins")
        return (released - rest)[:m] > 0.5
    if family == "mean_sum":  # mean canary i adds 2^i ratings of 5: 2·2^i to Σ (r − 3)
        return _decoded((float(released) - float(np.sum(sums))) / 2.0, 1.0, grid / 2.0, m)
    if family == "mean_count":
        return _decoded(float(released) - float(np.sum(counts)), 1.0, grid, m)
    if family == "user_mean_sum":  # canary i adds a mean offset of (h/32)·2^i
        half_range = 0.5 * (RATING_RANGE[1] - RATING_RANGE[0])
        rest_sum = float(np.sum(np.clip(sums / counts, -half_range, half_range)))
        return _decoded(float(released) - rest_sum, _user_mean_unit(), grid, m)
    return _decoded(float(released) - len(counts), 1.0, grid, m)  # user_count: 1 a user


def family_scores(run: Run, family: str) -> np.ndarray:
    """The scores (item families: NaN abstains) or decoded bits (:data:`DECODED` families) of ``family`` in ``run``."""
    own = run.world.own_items.get(family)
    if family in ("item_counts", "item_bias_sums"):
        return _vector(run, family)[own].sum(axis=1)
    if family == "item_recounts":
        return _on_trained(run, family, _vector(run, family))
    if family == "item_grams":
        return _on_trained(run, family, _per_trained_item(run, family, _gram_trace))
    if family == "item_linear":
        return _on_trained(run, family, _per_trained_item(run, family, _squared_norm))
    if family == "gram":  # DPFW: W_jj = Σ_i A_ij², the canary's alone on its own items
        return _diagonal_per_item(run, family)[own].sum(axis=1)
    if family == "oja_product":  # DPFW Oja: (AᵀA v)_j = Σ_i A_ij (A_i·v), the canary's alone on its items
        return np.sum(np.abs(run.tap.outputs[family]), axis=0)[own].sum(axis=1)
    if family == "vote_flips":  # one-bit InP: the randomised bits on the canary's own items
        return _per_item_total(run, family, run.world.ratings.n_items)[own].sum(axis=1)
    if family == "grap_gradient":  # a +1 vote's loss gradient is negative: minus the column sums
        return -np.sum([matrix.sum(axis=0) for matrix in run.tap.outputs[family]], axis=0)[own].sum(axis=1)
    if family in ("outp_matrix", "objp_objective_noise"):  # the released X's columns lean to the votes
        (matrix,) = run.tap.outputs["outp_matrix" if family == "outp_matrix" else "objp_output"]
        return matrix.sum(axis=0)[own].sum(axis=1)
    if family in DECODED:
        return _decoded_bits(run, family)
    raise ValueError(f"no canary family for release {family!r}")


def audit_family(runs: list[Run], family: str) -> AuditResult:
    """The family's canaries pooled over ``runs`` (each canary lives in one run)."""
    key = DECODED[family][0] if family in DECODED else family
    included = np.concatenate([run.world.included[key] for run in runs])
    scores = np.concatenate([family_scores(run, family) for run in runs])
    return decoded_audit(scores, included) if family in DECODED else one_run_audit(scores, included)


@dataclass(frozen=True)
class ReleaseAudit:
    release: str
    claimed: float
    honest: AuditResult
    noise_off: AuditResult
    runs: int  # canary worlds pooled (honest and noise off alike)


def family_runs(release: str, runs: int = RUNS) -> int:
    """The worlds ``release``'s family pools: ``runs``, times :data:`RUN_FACTOR` for a family with
    few canaries a run."""
    return runs * RUN_FACTOR.get(release, 1)


def honest_runs(algorithm: str, epsilon: float, runs: int = RUNS, seed: int = 0) -> list[Run]:
    """``runs`` default-config runs with every release's noise on (seeds seed, seed + 1, ...)."""
    return [train_run(algorithm, epsilon, seed + i) for i in range(runs)]


def audit_release(algorithm: str, epsilon: float, release: str, honest: list[Run], runs: int = RUNS,
                  seed: int = 0) -> ReleaseAudit:
    """The family of ``release``: its bound on the first :func:`family_runs` honest runs and on as
    many runs with that release's noise off (same worlds as the honest runs)."""
    n = family_runs(release, runs)
    if len(honest) < n:
        raise ValueError(f"{release}'s family pools {n} worlds, {len(honest)} honest runs given")
    control = [train_run(algorithm, epsilon, seed + i, noise_off=release) for i in range(n)]
    return ReleaseAudit(release=release, claimed=honest[0].claimed, honest=audit_family(honest[:n], release),
                        noise_off=audit_family(control, release), runs=n)


def released_names(run: Run) -> set[str]:
    """Every release name the run's tap saw (the families must cover them all)."""
    return set(run.tap.grids) | set(run.tap.outputs) | set(run.tap.rows)


def audit_algorithm(algorithm: str, epsilon: float, runs: int = RUNS) -> list[ReleaseAudit]:
    """Every release of ``algorithm``'s default run: honest and with that release's noise off."""
    honest = honest_runs(algorithm, epsilon, max(family_runs(release, runs) for release in RELEASES[algorithm]))
    if released_names(honest[0]) != set(RELEASES[algorithm]) | set(UNAUDITED.get(algorithm, ())):
        raise RuntimeError(f"{algorithm}'s releases {sorted(released_names(honest[0]))} lack a canary family")
    return [audit_release(algorithm, epsilon, release, honest, runs) for release in RELEASES[algorithm]]


# ---------------------------------------------------------------------------- the suite
def rows_for(algorithm: str, epsilon: float, audits: list[ReleaseAudit]) -> list[dict]:
    """The suite's rows of one algorithm's audits at ``epsilon`` (one dataset name per release)."""
    rows = []
    for audit in audits:
        row = partial(make_row, SUITE, f"canaries-{audit.release}", algorithm, epsilon=epsilon, delta=DELTA,
                      seeds=audit.runs)
        rows += [
            row("epsilon_claimed", audit.claimed),
            row("epsilon_lower_bound", audit.honest.epsilon_lower_bound, baseline=audit.claimed),
            row("epsilon_lower_bound_noise_off", audit.noise_off.epsilon_lower_bound, baseline=audit.claimed),
            row("canaries", float(audit.noise_off.canaries)),
            row("guesses_noise_off", float(audit.noise_off.guesses)),
            row("correct_guesses_noise_off", float(audit.noise_off.correct)),
        ]
    return rows


def run(quick: bool) -> list[dict]:
    rows: list[dict] = []
    for algorithm in RELEASES:
        for epsilon in (1.0,) if quick else (0.5, 1.0):
            rows += rows_for(algorithm, epsilon, audit_algorithm(algorithm, epsilon))
    return rows


def markdown_table(audits: dict[str, list[ReleaseAudit]]) -> str:
    """The audit table of ``docs/benchmarks.md``: release × claimed ε × lower bounds."""
    lines = ["| algorithm | release | claimed ε | lower bound, honest | lower bound, noise off | "
             "correct / guesses (noise off) | canaries |", "|---|---|---|---|---|---|---|"]
    for algorithm, results in audits.items():
        for a in results:
            lines.append(f"| {algorithm} | `{a.release}` | {a.claimed:.3f} | {a.honest.epsilon_lower_bound:.2f} | "
                         f"{a.noise_off.epsilon_lower_bound:.2f} | {a.noise_off.correct} / {a.noise_off.guesses} | "
                         f"{a.noise_off.canaries} |")
    return "\n".join(lines)


__all__ = ["AuditResult", "CanaryWorld", "RELEASES", "ReleaseAudit", "Run", "UNAUDITED", "VARIANTS", "audit_algorithm",
           "audit_family", "audit_release", "canary_world", "decoded_audit", "default_config", "epsilon_lower_bound",
           "family_runs", "family_scores", "honest_runs", "markdown_table", "one_run_audit", "p_value", "released_names",
           "rows_for", "train_run", "vote_world"]
