"""Suite ``lifetime``: a simulated service life (issue 29) — does retraining go on for years?

Each *life* is a stream of users joining, items being released and ratings arriving, replayed day
by day against the service's own ledger: a fresh embedded SQLite database (migrated), the block
calendar (one block per UTC month), a data set with the service's default caps (data set 10 and
person budget ``all`` 10, both at δ = 1e-6) and, every simulated day, one scheduled retrain as
:func:`app.services.training.schedule.scheduled_retrain` starts it for an active DPALS model on the
ε-aware defaults: :func:`app.services.training.requests.start_training` with the scheduler's
arguments (DPALS, ``epsilon = Settings.retrain_epsilon`` = 1 per run, the life's objective, no
hyper-parameters) at an injected clock (``now``). So the runs' events, their calibration, the block
selection (:func:`app.ledger.select_cohorts`) and every block's composed state are the service's.

Sizing (as issue 29 allows): the block choice depends on the ledger only, so every daily run's
charge is replayed without training it; the model in force at each window's end is trained in full
(the service's registry config of that run with a noise seed, on exactly the ratings of the blocks
the run reads, made before its day); a daily run's trained set is taken from its count release alone
(the exact count of the data it reads plus its count noise, then DPALS's frequent-item rule). The
ratings stay in memory (the suite filters them by the cohorts the ledger recorded on the run, as the
loaders' cohort filter does); the count statistic is the plain count (DPALS samples at most k
ratings per user first: a user above k counts less, so this slightly overstates a count).

Policies (:data:`POLICIES`): ``single-cap`` is the service before blocks — one account for everyone,
emulated by putting every user in one block (``legacy``; a run whose blocks exclude it reads no user,
which the old service refused: ``skipped:budget``, the model in force stays); ``cohort-blocks`` is
the default (a user's block is the UTC month she joined; the admin declares a per-period user
bound); ``user-period`` is the ``user_period`` privacy unit (the data set and its own person budget
``all-user_period``, caps as above, are created with that unit; a block holds the ratings created in
its month, whoever made them; the admin declares the per-period bound on (user, period) units, i.e.
users rating in a month): a run reads the ratings created in the periods the ledger chose for it,
one training row per (user, period) made by the service's loader step
(:func:`app.db.loaders.unit_ratings`), and is served per user (she is folded in from all her
ratings, as the other policies' users are).

Lives: ``synthetic-steady`` and ``synthetic-growing`` (:func:`generate_life`, parameters in
:data:`STEADY` / :data:`GROWING`, stated below and not tuned to the targets) and ``ml-100k``
replayed on its real timestamps (``../shared/data/ml-100k/u.data.gz``; skipped, and said so, when
absent). One life per objective: the rating life reports RMSE, the ranking life Recall@20.

Rows per window end T (every ``WINDOW`` days while T + WINDOW <= the life's days), life, objective
and policy, ``dataset`` = ``<life>-<objective>@day<T>``:

* ``rmse`` / ``recall@20``: the model in force at T, users folded in from their own ratings before
  T (as the service serves them, exhausted blocks included), scored on the next window: RMSE on its
  ratings (clipped to the scale; items released after the model are scored by its baseline), or
  Recall@20 of the positives (ratings >= 4) rated in it among items the user had not rated — for
  every user with history before T; mean of ``SEEDS`` noise seeds. ``baseline`` is the free
  baseline at the same time: the user's mean rating, or DP popularity (the same run's counts).
* ``trained_share``: over the window's days, the share of items whose count in the blocks the model
  in force read exceeds 3x that run's count-noise σ (a public number) that the model trained;
  ``crossed_trained``: of the items crossing that level in the window, the share trained within two
  retrain periods of crossing.
* ``active_blocks``: blocks read by the run in force; ``max_block_epsilon``: the largest composed ε
  of any block (data set's and person budget's, stored states; ``ledger_verify_ok`` at the life's
  end replays every block from the ledger with :func:`app.ledger.verify_blocks`).

Target rows (``<life>-<objective>``, issue 29's for ``cohort-blocks`` and the same beside it for
``user-period``, :data:`TARGET_POLICIES`; value 1 = pass, 0 = fail): quality at every window from
day 90 within 10 % of the day-60 window's (``quality_within_10pct``) and never below the free
baseline (``quality_not_below_baseline``), ``crossed_trained`` >= 0.95 over the life
(``count_level_trained``), every block within its cap at every window (``blocks_within_cap``).

Cost, measured on the shared 2-core VM beside other jobs (docs/benchmarks.md has the runs): the
quick form (180 days, 20,000 arrivals a year, 14-day windows, the rating objective, one seed, the
steady life, the three policies) 52 s wall, 21 CPU-seconds. The full form (730 days, 3 seeds, both
objectives, steady and growing lives, ML-100K) has not yet run end to end: with the three policies
ML-100K took 78 s wall (52 CPU-seconds, both objectives) and the steady life 261 s (rating, 168
CPU-seconds) and 867 s wall (ranking, 17 CPU-minutes); with two policies, before the calibration
memo, the growing ranking life took more than 11 CPU-minutes (unfinished), mostly the daily
ledger replay and the ranking evaluations.
"""

from __future__ import annotations

import gzip
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Settings
from app.core.algorithms import get_algorithm
from app.core.data.ratings import Ratings
from app.core.eval.metrics import ranking_metrics, rating_rmse
from app.core.mf.dpals import (
    DPALSConfig,
    bound_statistic,
    count_floor,
    count_noise_std,
    frequent_items,
    kept_floor,
    release_contribution_bound,
)
from app.core.mf.foldin import fold_in_users, user_offsets
from app.core.mf.model import PublicModel
from app.core.privacy.blocks import LEGACY, USER, USER_PERIOD, cohort_of
from app.core.privacy.keyed import KeyedRandomness
from app.core.privacy.releaser import GaussianReleaser
from benchmarks.evaluation import model_rmse
from benchmarks.harness import limit_threads, make_row, mean_std

SUITE = "lifetime"
ROOT = Path(__file__).resolve().parents[1]
ML100K = ROOT.parent / "shared" / "data" / "ml-100k" / "u.data.gz"
_SETTINGS = Settings.model_fields
CAP = float(_SETTINGS["default_epsilon_cap"].default)  # data set cap (the person budget's is the same)
DELTA = float(_SETTINGS["default_delta"].default)
RETRAIN_EPSILON = float(_SETTINGS["retrain_epsilon"].default)  # the policy's ε per scheduled run
PERIOD = "month"  # the default block period (Settings.privacy_block_period)
RUN_HOUR = 3  # the scheduler's daily tick (UTC)
RATING_RANGE = (1.0, 5.0)
POSITIVE = 4.0  # lo + 0.75 (hi - lo): the ranking objective's positives
LEVEL = 3.0  # count level: 3x the run's count-noise sigma
WITHIN = 2  # retrain periods an item crossing the level may wait to be trained
K = 20
SEEDS = (0, 1, 2)
WINDOW = 30
QUICK_WINDOW = 14
OBJECTIVES = ("rating", "ranking")
BLAS_THREADS = 2


# ---------------------------------------------------------------------------- lives
@dataclass(frozen=True)
class ArrivalParams:
    """A synthetic product's life. Ratings follow ``production_synthetic``'s value model
    (app/core/data/synthetic.py: mean + user bias + item bias + u.v + noise, rounded to 0.5 steps,
    clipped to 1..5); on top of it users join, items are released and tastes drift over time."""

    days: int = 730
    arrivals_per_year: float = 100_000.0  # users joining per year at day 0 (Poisson per day)
    growth_per_year: float = 0.0  # the arrival rate grows linearly by this multiple of itself per year
    initial_items: int = 1_000  # the catalogue at day 0
    items_per_day: float = 3.0  # releases per day afterwards (Poisson)
    rank: int = 16
    item_exponent: float = 0.9  # Zipf popularity of a random rank order, as production_synthetic
    freshness_days: float = 120.0  # a release's extra appeal decays with this time constant
    freshness_floor: float = 0.3  # an old item keeps this share of its appeal
    activity_exponent: float = 1.2  # Pareto activity (ratings per user), as production_synthetic
    activity_scale: float = 4.0  # ratings per user = ceil(scale x Pareto), within [min, max]
    min_ratings: int = 5
    max_ratings: int = 400
    activity_days: float = 60.0  # a user's first rating is on her arrival day, the rest Exp(mean) later
    drift_days: float = 365.0  # a user's taste turns 90 degrees in this time
    candidates: int = 20  # a rating's item: the best of this many popularity draws by taste + Gumbel
    taste_choice: float = 1.5  # weight of u.v in that choice
    global_mean: float = 3.5
    bias_std: float = 0.35
    signal_std: float = 0.8
    noise: float = 0.5


STEADY = ArrivalParams()
GROWING = replace(STEADY, growth_per_year=1.0)  # 100,000 users in the first year's rate, doubling in a year


@dataclass(frozen=True)
class Life:
    """A replayable life: per user her arrival day, per item its release day (non-decreasing: an
    item's index is its release order) and the ratings sorted by day."""

    name: str
    start: datetime
    days: int
    arrival: np.ndarray
    release: np.ndarray
    users: np.ndarray
    items: np.ndarray
    values: np.ndarray
    day: np.ndarray
    max_users: int  # the admin's declared bounds (next power of ten at or above)
    max_users_per_period: int
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def n_users(self) -> int:
        return len(self.arrival)

    def n_items_at(self, day: int) -> int:
        """The catalogue on ``day`` (items released on or before it)."""
        return int(np.searchsorted(self.release, day, side="right"))

    def clock(self, day: int) -> datetime:
        return self.start + timedelta(days=day, hours=RUN_HOUR)


def declared_bound(n: float) -> int:
    """The bound an admin declares: the next power of ten at or above ``n``."""
    return int(10 ** math.ceil(math.log10(max(n, 1.0))))


def _arrival_days(p: ArrivalParams, rng: np.random.Generator) -> np.ndarray:
    days = np.arange(p.days)
    rate = p.arrivals_per_year / 365.0 * (1.0 + p.growth_per_year * days / 365.0)
    return np.repeat(days, rng.poisson(rate)).astype(np.int64)


def _release_days(p: ArrivalParams, rng: np.random.Generator) -> np.ndarray:
    later = rng.poisson(p.items_per_day, p.days - 1)
    return np.concatenate([np.zeros(p.initial_items, np.int64), np.repeat(np.arange(1, p.days), later)])


def _rating_events(p: ArrivalParams, arrival: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(user, day) of every rating before the horizon, sorted by day then user."""
    counts = np.clip(np.ceil(p.activity_scale * (rng.pareto(p.activity_exponent, len(arrival)) + 1.0)),
                     p.min_ratings, p.max_ratings).astype(np.int64)
    users = np.repeat(np.arange(len(arrival)), counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    delay = rng.exponential(p.activity_days, len(users))
    delay[first] = 0.0
    day = arrival[users] + np.floor(delay).astype(np.int64)
    keep = day < p.days
    users, day = users[keep], day[keep]
    order = np.lexsort((users, day))
    return users[order], day[order]


def generate_life(name: str, p: ArrivalParams, seed: int = 0, start: datetime | None = None) -> Life:
    """A synthetic life, a function of (``p``, ``seed``) only."""
    rng = np.random.default_rng(seed)
    arrival, release = _arrival_days(p, rng), _release_days(p, rng)
    n_users, n_items = len(arrival), len(release)
    a = (p.signal_std**2 / p.rank) ** 0.25
    V = rng.normal(0.0, a, (n_items, p.rank))
    U0, U1 = rng.normal(0.0, a, (n_users, p.rank)), rng.normal(0.0, a, (n_users, p.rank))
    item_bias, user_bias = rng.normal(0.0, p.bias_std, n_items), rng.normal(0.0, p.bias_std, n_users)
    appeal = (rng.permutation(n_items) + 1.0) ** -p.item_exponent
    users, day = _rating_events(p, arrival, rng)
    items = np.empty(len(users), np.int64)
    values = np.empty(len(users))
    bounds = np.searchsorted(day, np.arange(p.days + 1))
    for d in range(p.days):
        lo, hi = bounds[d], bounds[d + 1]
        if lo == hi:
            continue
        u = users[lo:hi]
        released = int(np.searchsorted(release, d, side="right"))
        w = appeal[:released] * (p.freshness_floor + (1 - p.freshness_floor)
                                 * np.exp(-(d - release[:released]) / p.freshness_days))
        cdf = np.cumsum(w)
        cand = np.minimum(np.searchsorted(cdf, rng.random((hi - lo, p.candidates)) * cdf[-1], side="right"),
                          released - 1)
        theta = (0.5 * math.pi / p.drift_days) * (d - arrival[u])
        taste = np.cos(theta)[:, None] * U0[u] + np.sin(theta)[:, None] * U1[u]
        fit = np.einsum("nr,ncr->nc", taste, V[cand])
        pick = np.argmax(p.taste_choice * fit + rng.gumbel(size=fit.shape), axis=1)
        chosen = cand[np.arange(hi - lo), pick]
        items[lo:hi] = chosen
        values[lo:hi] = (p.global_mean + user_bias[u] + item_bias[chosen] + fit[np.arange(hi - lo), pick]
                         + rng.normal(0.0, p.noise, hi - lo))
    values = np.clip(np.round(values * 2.0) / 2.0, *RATING_RANGE)
    keep = _first_of_each_pair(users, items, n_items)
    monthly = np.bincount(arrival // 30).max() if n_users else 1
    return Life(name, start or datetime(2030, 1, 1, tzinfo=UTC), p.days, arrival, release, users[keep], items[keep],
                values[keep], day[keep], declared_bound(n_users), declared_bound(monthly),
                {"users": n_users, "items": n_items, "ratings": int(keep.sum()), "seed": seed})


def _first_of_each_pair(users: np.ndarray, items: np.ndarray, n_items: int) -> np.ndarray:
    """Mask keeping the first (earliest) rating of every (user, item) pair: a re-draw is dropped."""
    keys = users * n_items + items
    _, first = np.unique(keys, return_index=True)
    keep = np.zeros(len(keys), dtype=bool)
    keep[first] = True
    return keep


def load_ml100k_life(path: Path = ML100K) -> Life | None:
    """MovieLens-100K on its real timestamps: a user joins with her first rating, an item is released
    with its first rating (the public catalogue grows as items are first seen); None when absent."""
    if not path.exists():
        return None
    with gzip.open(path, "rt") as fh:
        raw = np.loadtxt(fh, dtype=np.int64)
    user_raw, item_raw, value, stamp = raw.T
    start_s = int(stamp.min()) // 86_400 * 86_400
    day = (stamp - start_s) // 86_400
    _, u = np.unique(user_raw, return_inverse=True)
    _, i = np.unique(item_raw, return_inverse=True)
    first_item = np.full(i.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(first_item, i, day)
    by_release = np.lexsort((np.arange(len(first_item)), first_item))
    rank = np.empty_like(by_release)
    rank[by_release] = np.arange(len(by_release))
    arrival = np.full(u.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(arrival, u, day)
    order = np.lexsort((u, day))
    monthly = np.bincount(arrival // 30).max()
    return Life("ml-100k", datetime.fromtimestamp(start_s, UTC), int(day.max()) + 1, arrival,
                first_item[by_release], u[order], rank[i][order], value[order].astype(np.float64), day[order],
                declared_bound(len(arrival)), declared_bound(monthly),
                {"users": len(arrival), "items": len(first_item), "ratings": len(value)})


# ---------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class Policy:
    """How a life's data maps to privacy blocks and what the data set declares.

    ``label`` maps days to block labels: a user-level unit (``unit`` ``user``) puts each rating in
    the block of her arrival day, a ``user_period`` unit in the block of the rating's own day (its
    ``created_at``, as the service keys it). ``in_force(cohorts)`` says whether a reserved run
    replaces the model (single-cap: only a run that reads the one block everyone is in);
    ``per_period_bound`` whether the admin declares ``max_users_per_period`` (:meth:`declared_per_period`).
    """

    name: str
    label: Callable[[Life, np.ndarray], np.ndarray]
    in_force: Callable[[Sequence[str]], bool]
    per_period_bound: bool
    unit: str = USER

    def rating_blocks(self, life: Life) -> tuple[list[str], np.ndarray]:
        """(the block labels that hold data, each rating's index into them)."""
        if self.unit == USER_PERIOD:
            names, codes = np.unique(self.label(life, life.day), return_inverse=True)
            return [str(n) for n in names], codes
        names, user_codes = np.unique(self.label(life, life.arrival), return_inverse=True)
        return [str(n) for n in names], user_codes[life.users]

    def declared_per_period(self, life: Life) -> int | None:
        """The admin's ``max_users_per_period`` (the next power of ten at or above the true number):
        users joining in a month (``user``), or (user, period) units of a month, i.e. users rating
        in it (``user_period``: a run's bound counts units, :func:`app.services.training.requests.run_user_bound`)."""
        if not self.per_period_bound:
            return None
        if self.unit != USER_PERIOD:
            return life.max_users_per_period
        _, codes = self.rating_blocks(life)
        n_blocks = int(codes.max()) + 1 if len(codes) else 1
        units = np.unique(life.users * n_blocks + codes)
        return declared_bound(float(np.bincount(units % n_blocks).max()) if len(units) else 1.0)

    def training_data(self, life: Life, mask: np.ndarray, n_items: int) -> Ratings:
        """The ratings ``mask`` over the first ``n_items`` items as a run trains on them: one row per
        user, or (``user_period``) one row per (user, period) made by the service's own loader step
        (:func:`app.db.loaders.unit_ratings`, rows ``"<user>@<period>"``, a rating's creation on its day)."""
        if self.unit == USER_PERIOD:
            from app.db.loaders import unit_ratings
            from app.db.models import BlockCalendar

            cal = BlockCalendar(period=PERIOD, start=cohort_of(life.start, PERIOD))
            start_us = round(life.start.timestamp() * 1_000_000)
            created = start_us + life.day[mask].astype(np.int64) * 86_400_000_000
            items = np.arange(n_items)
            return unit_ratings(items, items, life.users[mask], life.items[mask], life.values[mask], created, cal)
        who, rows = np.unique(life.users[mask], return_inverse=True)
        return Ratings.from_indices(rows, life.items[mask], life.values[mask], user_ids=who,
                                    item_ids=np.arange(n_items))


def _labels(life: Life, days: np.ndarray) -> np.ndarray:
    names = np.array([cohort_of(life.start + timedelta(days=int(d)), PERIOD) for d in range(life.days + 1)])
    return names[np.minimum(days, life.days)]


POLICIES: tuple[Policy, ...] = (
    Policy("single-cap", lambda life, days: np.full(len(days), LEGACY), lambda cohorts: LEGACY in cohorts, False),
    Policy("cohort-blocks", _labels, lambda cohorts: True, True),
    Policy("user-period", _labels, lambda cohorts: True, True, USER_PERIOD),
)
TARGET_POLICIES = ("cohort-blocks", "user-period")  # issue 29's targets are cohort-blocks'; user-period beside it


# ---------------------------------------------------------------------------- ledger replay
@dataclass(frozen=True)
class RunRecord:
    """One scheduled retrain as the ledger took it (``config`` None: refused, nothing charged)."""

    day: int
    cohorts: tuple[str, ...]
    config: dict[str, Any] | None


@dataclass(frozen=True)
class LedgerLife:
    runs: list[RunRecord]
    max_block_epsilon: dict[int, float]  # window end -> largest composed ε of any block
    verify_ok: bool
    seconds: float


@contextmanager
def _database() -> Iterator[str]:
    from app.db.migrate import upgrade_head
    from app.db.session import dispose_engines

    with tempfile.TemporaryDirectory(prefix="privrec-lifetime-") as folder:
        url = f"sqlite:///{Path(folder) / 'life.db'}"
        upgrade_head(url)
        try:
            yield url
        finally:
            dispose_engines()


def _setup(url: str, life: Life, policy: Policy) -> None:
    from app import ledger
    from app.db.session import session_scope
    from app.db.stores import blocks as block_store
    from app.services import budget

    with session_scope(url) as s:
        block_store.ensure_calendar(s, PERIOD, life.start)
        person = ledger.DEFAULT_PERSON_BUDGET
        if policy.unit != USER:  # a person budget holds data sets of one unit: the admin creates one of hers
            person = f"all-{policy.unit}"
            budget.put_person_budget(s, name=person, epsilon_cap=ledger.DEFAULT_PERSON_CAP,
                                     delta=ledger.DEFAULT_PERSON_DELTA, relation=None, reason="lifetime",
                                     actor="admin", privacy_unit=policy.unit)
        ds = budget.ensure_dataset(s, "life", rating_min=RATING_RANGE[0], rating_max=RATING_RANGE[1],
                                   epsilon_cap=CAP, delta=DELTA, person_budget=person, privacy_unit=policy.unit)
        ds.max_users = life.max_users
        ds.max_users_per_period = policy.declared_per_period(life)


def _add_items(url: str, first: int, last: int) -> None:
    from sqlalchemy import insert

    from app.db.models import Item
    from app.db.session import session_scope
    from app.services import budget

    if last <= first:
        return
    with session_scope(url) as s:
        ds_id = budget.get_dataset(s, "life").id
        s.execute(insert(Item), [{"dataset_id": ds_id, "external_id": f"i{j}", "categories": [], "features": {}}
                                 for j in range(first, last)])


def _scheduled_run(url: str, life: Life, day: int, objective: str) -> RunRecord:
    """The day's scheduled retrain: the scheduler's start_training call at the injected clock."""
    from app.db.session import session_scope
    from app.errors import BudgetExceeded
    from app.services.training.requests import start_training

    try:
        with session_scope(url) as s:
            run = start_training(s, dataset="life", algorithm="dpals", epsilon=RETRAIN_EPSILON, hyperparameters={},
                                 objective=objective, actor="scheduler", trigger="schedule", now=life.clock(day))
            return RunRecord(day, tuple(run.cohorts or ()), dict(run.config))
    except BudgetExceeded:
        return RunRecord(day, (), None)


def _max_block_epsilon(url: str) -> float:
    from app import ledger
    from app.db.session import session_scope
    from app.services import budget

    with session_scope(url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "life").id)
        return max(ledger.blocks_spent(s, acct), ledger.blocks_spent(s, acct.person_budget))


def _verify(url: str) -> bool:
    from app import ledger
    from app.db.session import session_scope

    with session_scope(url) as s:
        return all(check.ok for _, _, check in ledger.verify_blocks(s))


def replay_ledger(life: Life, policy: Policy, objective: str, window_ends: Sequence[int]) -> LedgerLife:
    """Every day's scheduled retrain charged on a fresh database (nothing trained)."""
    start = time.perf_counter()
    runs: list[RunRecord] = []
    spent: dict[int, float] = {}
    with _database() as url:
        _setup(url, life, policy)
        have = 0
        for day in range(life.days):
            now_items = life.n_items_at(day)
            _add_items(url, have, now_items)
            have = now_items
            runs.append(_scheduled_run(url, life, day, objective))
            if day in window_ends:
                spent[day] = _max_block_epsilon(url)
        ok = _verify(url)
    return LedgerLife(runs, spent, ok, time.perf_counter() - start)


def runs_in_force(runs: Sequence[RunRecord], policy: Policy) -> list[int | None]:
    """Per day, the index of the run whose model is in force (None before the first one)."""
    out: list[int | None] = []
    current: int | None = None
    for k, run in enumerate(runs):
        if run.config is not None and policy.in_force(run.cohorts):
            current = k
        out.append(current)
    return out


# ---------------------------------------------------------------------------- count level
def run_seed(seed: int, day: int) -> int:
    """The noise seed of the run of ``day`` in the life's ``seed``-th replay (its trained model's too)."""
    return 7919 * seed + day


def released_config(config: dict[str, Any], unit_counts: np.ndarray, seed: int) -> DPALSConfig:
    """The run's config as its first release leaves it: the bound histogram of its rows' counts
    (``unit_counts``, one per user or (user, period) row it reads) released with the run's own
    noise seed, k or B set from it and the laws in it applied (defaults rules 8–10), exactly as
    the trained run does; without a bound law, the run's config."""
    run = get_algorithm("dpals").config_from_dict({**config, "seed": seed})
    releaser = GaussianReleaser(None, KeyedRandomness(run.seed))
    return release_contribution_bound(bound_statistic(unit_counts, run), run, releaser)


def trained_from_counts(counts: np.ndarray, config: DPALSConfig, rng: np.random.Generator,
                        kept: np.ndarray | None = None) -> np.ndarray:
    """The trained-item mask a run's count release gives (noisy counts of σ = :func:`count_noise_std`
    at its released bound, floored at 1, then DPALS's frequent-item rule with its count floor, and
    rule 11's ``kept`` items, the model in force's trained set, above their floor): post-processing
    of its releases and that published model alone."""
    noisy = np.maximum(counts + rng.normal(0.0, count_noise_std(config), len(counts)), 1.0)
    mask = np.zeros(len(counts), dtype=bool)
    mask[frequent_items(noisy, config.frequent_fraction, count_floor(config), kept, kept_floor(config))] = True
    return mask


def level_share(counts: np.ndarray, sigma: float, trained: np.ndarray) -> float | None:
    """Share of the items whose count exceeds LEVEL x sigma that are trained (None: no such item)."""
    return level_share_mask(counts > LEVEL * sigma, trained)


def crossed_trained(above: np.ndarray, trained: np.ndarray, within: int = WITHIN) -> tuple[np.ndarray, np.ndarray]:
    """(day of each crossing, whether that item was trained within ``within`` runs of it).

    ``above`` and ``trained`` are (days x items) booleans; a crossing is an item above the level on a
    day it was not above the day before (or on the first day); crossings fewer than ``within`` days
    before the end are left out (their wait is not over)."""
    days = above.shape[0]
    before = np.vstack([np.zeros((1, above.shape[1]), dtype=bool), above[:-1]])
    d, j = np.nonzero(above & ~before)
    keep = d + within < days
    d, j = d[keep], j[keep]
    ok = np.zeros(len(d), dtype=bool)
    for w in range(within + 1):
        ok |= trained[d + w, j]
    return d, ok


# ---------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class WindowData:
    """Users with history before T who act in the window [T, T + W): their history, and their
    ratings of the window (rating life) or positives on unrated items (ranking life)."""

    history: Ratings
    test: Ratings


def window_data(life: Life, end: int, length: int, objective: str) -> WindowData:
    n_items = life.n_items_at(end + length - 1)
    past = life.day < end
    nxt = (life.day >= end) & (life.day < end + length)
    if objective == "ranking":
        nxt &= life.values >= POSITIVE
    had = np.zeros(life.n_users, dtype=bool)
    had[life.users[past]] = True
    nxt &= had[life.users]
    who = np.unique(life.users[nxt])
    index = np.full(life.n_users, -1)
    index[who] = np.arange(len(who))
    items = np.arange(n_items)

    def ratings(mask: np.ndarray, ones: bool) -> Ratings:
        mask = mask & (index[life.users] >= 0)
        vals = np.ones(int(mask.sum())) if ones else life.values[mask]
        return Ratings.from_indices(index[life.users[mask]], life.items[mask], vals, user_ids=who, item_ids=items)

    return WindowData(ratings(past, False), ratings(nxt, objective == "ranking"))


def pad_model(model: PublicModel, n_items: int) -> PublicModel:
    """The model over a catalogue of ``n_items`` (items released after it: untrained, no bias, count 1)."""
    extra = n_items - model.n_items
    if extra <= 0:
        return model
    return replace(model, item_ids=np.arange(n_items), item_factors=np.vstack([model.item_factors,
                                                                               np.zeros((extra, model.rank))]),
                   trained_mask=np.concatenate([model.trained_mask, np.zeros(extra, dtype=bool)]),
                   item_counts=np.concatenate([model.item_counts, np.ones(extra)]),
                   item_biases=np.concatenate([model.item_biases, np.zeros(extra)]))


def popularity_model(model: PublicModel) -> PublicModel:
    """Rank by the run's DP counts alone (free post-processing of the same release)."""
    return replace(model, item_factors=np.zeros_like(model.item_factors), item_biases=np.log(model.item_counts),
                   trained_mask=np.ones(model.n_items, dtype=bool), config={**model.config, "objective": "ranking"})


def window_recall(model: PublicModel, data: WindowData, k: int = K) -> float:
    """Recall@k of the window's positives, users folded in from their positives before T (the
    ranking objective's view of their data), every item they had rated excluded."""
    positives = data.history.csr.copy()
    positives.data = (positives.data >= POSITIVE).astype(np.float64)
    positives.eliminate_zeros()
    rows, cols = positives.nonzero()
    query = Ratings.from_indices(rows, cols, np.ones(len(rows)), user_ids=data.history.user_ids,
                                 item_ids=data.history.item_ids)
    users = fold_in_users(model, query)
    offsets = user_offsets(model, query)

    def scores(idx: np.ndarray) -> np.ndarray:
        return np.asarray(offsets[idx, None] + model.item_biases + users[idx] @ model.item_factors.T)

    return float(ranking_metrics(scores, data.test, data.history, k)[f"recall@{k}"])


def window_quality(model: PublicModel, data: WindowData, objective: str) -> tuple[float, float]:
    """(the model's quality, the free baseline's) on the window: RMSE vs the user's mean rating, or
    Recall@20 vs DP popularity of the same run."""
    model = pad_model(model, data.history.n_items)
    if objective == "rating":
        user_mean = rating_rmse(data.test, np.zeros(data.test.nnz), train=data.history,
                                trained_mask=np.zeros(data.test.n_items, dtype=bool), clip=RATING_RANGE)
        return model_rmse(model, data.history, data.test, clip=RATING_RANGE), user_mean
    return window_recall(model, data), window_recall(popularity_model(model), data)


# ---------------------------------------------------------------------------- one life
@dataclass(frozen=True)
class Blocks:
    """A life's ratings by block under one policy: the labels holding data, each rating's index."""

    names: list[str]
    codes: np.ndarray
    unit: str = USER  # a training row per user, or per (user, period) (``user_period``)

    def unit_counts(self, per_user_block: np.ndarray, cohorts: Sequence[str]) -> np.ndarray:
        """The counts of the training rows a run reading ``cohorts`` has, from the (users x blocks)
        counts: per user over the blocks read, or per (user, period) of them."""
        read = [k for k, name in enumerate(self.names) if name in cohorts]
        mine = per_user_block[:, read]
        return mine.ravel() if self.unit == USER_PERIOD else mine.sum(axis=1)

    def reads(self, cohorts: Sequence[str]) -> np.ndarray:
        """Mask of the ratings in ``cohorts``."""
        wanted = [k for k, name in enumerate(self.names) if name in cohorts]
        return np.isin(self.codes, wanted)


@dataclass
class _Cell:
    quality: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    share: list[float] = field(default_factory=list)
    crossed: list[float] = field(default_factory=list)
    above: list[float] = field(default_factory=list)
    n_users: int = 0


def train_run(life: Life, policy: Policy, blocks: Blocks, run: RunRecord, seed: int,
              kept: np.ndarray | None = None) -> PublicModel:
    """The run's model: its registry config with a noise seed, on the ratings of its blocks before its
    day; ``kept``: the model in force's trained items (a mask by catalogue position, item ids being
    positions), as the service hands them to the run (rule 11)."""
    algo = get_algorithm("dpals")
    mask = (life.day < run.day) & blocks.reads(run.cohorts)
    data = policy.training_data(life, mask, life.n_items_at(run.day))
    config = algo.config_from_dict({**(run.config or {}), "seed": run_seed(seed, run.day)})
    inputs: dict[str, Any] = {} if kept is None else {"kept_items": np.flatnonzero(kept)}
    return algo.train(data, config, **inputs)


def count_tracks(life: Life, blocks: Blocks, objective: str, runs: Sequence[RunRecord], force: Sequence[int | None],
                 seed: int) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """(above the count level, trained, kept) per day x item of the life's final catalogue, for the
    model in force each day: its blocks' counts of the data before that day against LEVEL x its count
    σ at the bound its histogram released (the run's noise seed), and its trained set from its
    count release (drawn with this seed on the run's day) and the items the model in force before it
    trained (``kept``, by run: what the service hands the run, rule 11)."""
    n_final = life.n_items_at(life.days - 1)
    counted = np.ones(len(life.values), dtype=bool) if objective == "rating" else life.values >= POSITIVE
    counts = np.zeros((len(blocks.names), n_final))
    per_user_block = np.zeros((life.n_users, len(blocks.names)), dtype=np.int32)
    above = np.zeros((life.days, n_final), dtype=bool)
    trained = np.zeros((life.days, n_final), dtype=bool)
    bounds = np.searchsorted(life.day, np.arange(life.days + 1))
    rng = np.random.default_rng(10_000 + seed)
    masks: dict[int, tuple[np.ndarray, float]] = {}
    kept: dict[int, np.ndarray] = {}
    in_force = np.zeros(n_final, dtype=bool)  # the trained set of the model in force before the run
    for d in range(life.days):
        if d > 0:
            lo, hi = bounds[d - 1], bounds[d]
            sel = counted[lo:hi]
            np.add.at(counts, (blocks.codes[lo:hi][sel], life.items[lo:hi][sel]), 1.0)
            np.add.at(per_user_block, (life.users[lo:hi][sel], blocks.codes[lo:hi][sel]), 1)
        k = force[d]
        if k is None:
            continue
        run = runs[k]
        if run.config is None:  # pragma: no cover - a refused run is never in force
            raise RuntimeError("a refused run cannot be in force")
        read = [j for j, name in enumerate(blocks.names) if name in run.cohorts]
        mine = counts[read].sum(axis=0) if read else np.zeros(n_final)
        n = life.n_items_at(run.day)
        if k not in masks:  # first seen on its own day: `mine` and the rows' counts are exactly what it read
            released = released_config(run.config, blocks.unit_counts(per_user_block, run.cohorts),
                                        run_seed(seed, run.day))
            kept[k] = in_force[:n].copy()
            masks[k] = (trained_from_counts(mine[:n], released, rng, kept[k]), count_noise_std(released))
            in_force = np.zeros(n_final, dtype=bool)
            in_force[:n] = masks[k][0]
        mask, sigma = masks[k]
        above[d] = mine > LEVEL * sigma
        trained[d, :n] = mask
    return above, trained, kept


def window_shares(above: np.ndarray, trained: np.ndarray, crossing: np.ndarray, crossing_ok: np.ndarray, t: int,
                  window: int) -> tuple[float | None, float | None, float]:
    """(mean over the window's days of the trained share of the items above the level, share of the
    window's crossings trained within WITHIN periods, mean number of items above the level); a share
    is None when no item was above the level, or none crossed it, in the window."""
    days = range(t - window, t)
    shares = [s for d in days if (s := level_share_mask(above[d], trained[d])) is not None]
    inside = (crossing >= t - window) & (crossing < t)
    return ((float(np.mean(shares)) if shares else None), (float(crossing_ok[inside].mean()) if inside.any() else None),
            float(above[t - window:t].sum(axis=1).mean()))


def level_share_mask(above: np.ndarray, trained: np.ndarray) -> float | None:
    """Share of the ``above`` items that are ``trained`` (None: none above)."""
    return float(trained[above].mean()) if above.any() else None


def life_rows(life: Life, objective: str, *, window: int = WINDOW, seeds: Sequence[int] = SEEDS,
              policies: Sequence[Policy] = POLICIES) -> list[dict]:
    """Every row of one life and objective, each policy beside the others."""
    ends = [t for t in range(window, life.days, window) if t + window <= life.days]
    metric = "rmse" if objective == "rating" else f"recall@{K}"
    rows: list[dict] = []
    for policy in policies:
        ledger_life = replay_ledger(life, policy, objective, ends)
        force = runs_in_force(ledger_life.runs, policy)
        names, codes = policy.rating_blocks(life)
        blocks = Blocks(names, codes, policy.unit)
        start = time.perf_counter()
        cells = {t: _Cell() for t in ends}
        kept: dict[int, dict[int, np.ndarray]] = {}  # by seed, run: the items its model in force trained
        for seed in seeds:
            above, trained, kept[seed] = count_tracks(life, blocks, objective, ledger_life.runs, force, seed)
            crossing, crossing_ok = crossed_trained(above, trained)
            for t in ends:
                share, crossed, n_above = window_shares(above, trained, crossing, crossing_ok, t, window)
                cells[t].share += [share] if share is not None else []
                cells[t].crossed += [crossed] if crossed is not None else []
                cells[t].above.append(n_above)
            rows.append(make_row(SUITE, f"{life.name}-{objective}", policy.name, "crossed_trained_life",
                                 float(crossing_ok.mean()) if len(crossing_ok) else 1.0, epsilon=RETRAIN_EPSILON,
                                 delta=DELTA, seeds=[seed]))
        models: dict[tuple[int, int], PublicModel] = {}
        for t in ends:
            k = force[t]
            if k is None:
                continue
            data = window_data(life, t, window, objective)
            cells[t].n_users = data.test.n_users
            for seed in seeds:
                if (k, seed) not in models:  # a model not in force at t is never in force again
                    models = {key: m for key, m in models.items() if key[1] != seed}
                    models[(k, seed)] = train_run(life, policy, blocks, ledger_life.runs[k], seed, kept[seed].get(k))
                quality, baseline = window_quality(models[(k, seed)], data, objective)
                cells[t].quality.append(quality)
                cells[t].baseline.append(baseline)
        seconds = (time.perf_counter() - start + ledger_life.seconds) / max(1, len(ends))
        for t in ends:
            rows += _window_rows(life, objective, policy, metric, t, cells[t], ledger_life, force, list(seeds),
                                 seconds)
        rows.append(make_row(SUITE, f"{life.name}-{objective}", policy.name, "ledger_verify_ok",
                             float(ledger_life.verify_ok), epsilon=RETRAIN_EPSILON, delta=DELTA,
                             seconds=ledger_life.seconds))
    present = {p.name for p in policies}
    return rows + [row for name in TARGET_POLICIES if name in present
                   for row in targets(rows, life, objective, ends, name)]

def _window_rows(life: Life, objective: str, policy: Policy, metric: str, t: int, cell: _Cell, ledger_life: LedgerLife,
                 force: Sequence[int | None], seeds: list[int], seconds: float) -> list[dict]:
    name = f"{life.name}-{objective}@day{t:03d}"
    common: dict[str, Any] = {"epsilon": RETRAIN_EPSILON, "delta": DELTA}
    out = []
    if cell.quality:
        q, q_std = mean_std(cell.quality)
        b, _ = mean_std(cell.baseline)
        out.append(make_row(SUITE, name, policy.name, metric, q, std=q_std, seeds=seeds, baseline=b, seconds=seconds,
                            **common))
    for label, values in (("trained_share", cell.share), ("crossed_trained", cell.crossed),
                          ("items_above_level", cell.above)):
        if values:  # a share is left out when no item was above (or crossed) the level
            v, v_std = mean_std(values)
            out.append(make_row(SUITE, name, policy.name, label, v, std=v_std, seeds=len(values), **common))
    k = force[t]
    blocks = len(ledger_life.runs[k].cohorts) if k is not None else 0
    out.append(make_row(SUITE, name, policy.name, "active_blocks", float(blocks), **common))
    out.append(make_row(SUITE, name, policy.name, "max_block_epsilon", ledger_life.max_block_epsilon[t],
                        baseline=CAP, **common))
    out.append(make_row(SUITE, name, policy.name, "eval_users", float(cell.n_users), **common))
    return out


# ---------------------------------------------------------------------------- targets
def targets(rows: Sequence[dict], life: Life, objective: str, ends: Sequence[int],
            policy: str = "cohort-blocks") -> list[dict]:
    """Issue 29's targets for ``policy`` (value 1 = pass): see the module docstring."""
    metric = "rmse" if objective == "rating" else f"recall@{K}"
    mine = {r["dataset"]: r for r in rows if r["algorithm"] == policy and r["metric"] == metric}
    at = {t: mine[f"{life.name}-{objective}@day{t:03d}"] for t in ends if f"{life.name}-{objective}@day{t:03d}" in mine}
    ref_day = next((t for t in ends if t >= 60), None)
    checked = [t for t in ends if t >= 90]
    ref = at.get(ref_day) if ref_day is not None else None
    lower_better = objective == "rating"
    within = ref is not None and bool(checked) and all(
        t in at and abs(at[t]["value"] / ref["value"] - 1.0) <= 0.10 for t in checked)
    not_below = bool(checked) and all(
        t in at and (at[t]["value"] <= at[t]["baseline"] if lower_better else at[t]["value"] >= at[t]["baseline"])
        for t in checked)
    crossed = [r["value"] for r in rows if r["algorithm"] == policy and r["metric"] == "crossed_trained_life"
               and r["dataset"] == f"{life.name}-{objective}"]
    caps = [r["value"] for r in rows if r["algorithm"] == policy and r["metric"] == "max_block_epsilon"
            and r["dataset"].startswith(f"{life.name}-{objective}@")]
    verdicts = {
        "quality_within_10pct": within,
        "quality_not_below_baseline": not_below,
        "count_level_trained": bool(crossed) and float(np.mean(crossed)) >= 0.95,
        "blocks_within_cap": bool(caps) and max(caps) <= CAP,
    }
    return [make_row(SUITE, f"{life.name}-{objective}", policy, f"target_{name}", float(ok), epsilon=RETRAIN_EPSILON,
                     delta=DELTA) for name, ok in verdicts.items()]


def summary(rows: Sequence[dict], days: Sequence[int] | None = None) -> str:
    """Markdown: per life-objective and window end (``days``: only those), each policy side by side:
    quality (free baseline), items above the count level, trained share, crossed trained, active
    blocks, largest block ε."""
    by: dict[str, dict[int, dict[str, dict[str, dict]]]] = {}
    for r in rows:
        if "@day" in r["dataset"]:
            life, day = r["dataset"].split("@day")
            by.setdefault(life, {}).setdefault(int(day), {}).setdefault(r["algorithm"], {})[r["metric"]] = r
    shown = {r["algorithm"] for r in rows}
    policies = [p.name for p in POLICIES if p.name in shown]
    head = " | ".join(f"{p}: quality (baseline) | above | trained | crossed | blocks | max ε" for p in policies)
    lines = []
    for life in sorted(by):
        lines += [f"\n{life}\n", f"| day | {head} |", "|---" * (1 + 6 * len(policies)) + "|"]
        for day in sorted(by[life]):
            if days is not None and day not in days:
                continue
            cells = [_cells(by[life][day].get(p, {})) for p in policies]
            lines.append(f"| {day} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cells(m: dict[str, dict]) -> str:
    q = m.get("rmse") or m.get(f"recall@{K}")
    quality = f"{_f(q, 'value')} ({_f(q, 'baseline')})" if q is not None else "-"
    return " | ".join([quality, _f(m.get("items_above_level"), "value", 0), _f(m.get("trained_share"), "value"),
                       _f(m.get("crossed_trained"), "value"), _f(m.get("active_blocks"), "value", 0),
                       _f(m.get("max_block_epsilon"), "value", 2)])


def _f(row: dict | None, key: str, places: int = 3) -> str:
    if row is None or row[key] is None:
        return "-"
    return f"{row[key]:.{places}f}"


# ---------------------------------------------------------------------------- the suite
def run(quick: bool) -> list[dict]:
    """Quick: the steady life for 180 days at 20,000 arrivals a year, 14-day windows, the rating
    objective, one seed. Full: steady and growing lives (730 days) and ML-100K, both objectives,
    30-day windows, three seeds."""
    rows: list[dict] = []
    with limit_threads(BLAS_THREADS):
        if quick:
            life = generate_life("synthetic-steady", replace(STEADY, days=180, arrivals_per_year=20_000.0))
            rows += life_rows(life, "rating", window=QUICK_WINDOW, seeds=SEEDS[:1])
        else:
            lives: list[Life] = [generate_life("synthetic-steady", STEADY), generate_life("synthetic-growing", GROWING)]
            ml = load_ml100k_life()
            if ml is None:
                print(f"lifetime: {ML100K} is absent: the ml-100k life is skipped")
            else:
                lives.append(ml)
            for life in lives:
                print(f"lifetime: {life.name}: {life.notes}")
                for objective in OBJECTIVES:
                    rows += life_rows(life, objective)
    print(summary(rows))
    return rows
