"""Budget arithmetic against the length of the history: a reservation, a projection and a budget
view after 10, 1,000 and 10,000 charged runs, on SQLite (and PostgreSQL when it is reachable:
``BENCH_PG_URL``, as the ``ingest`` suite).

The history is built through the ledger's own append path (``app.ledger.reserve``, one training
run row and one reservation per charged run, committed in batches of ``BATCH``), on a data set
of ``N_ITEMS`` public catalogue items whose cap and person-budget cap (``CAP``) fit every run.
Each run charges a DPALS-shaped event (a count release and ``STEPS`` steps of two Gaussian
releases, multiplier ``MULTIPLIER``): 10,000 of them compose to about epsilon 4.5 at delta 1e-6.

Rows, per backend and history length n (``dataset`` = ``<backend>-<n>-runs``), each the median
of ``REPEATS`` timings after one untimed warm-up, ``baseline`` the same metric at the smallest n,
``ratio`` = value / baseline (target: at most 2 from 10 to 10,000 runs):

* ``reservation_seconds`` - one more reservation (lock, charge the account and its person
  budget, append the entry, store both states, commit), as a training request makes it;
* ``projection_seconds``  - ``GET .../budget/projection?epsilon=1`` (``project_run``: DPALS
  calibrated to epsilon 1, charged to both budgets, the affordable count under both caps);
* ``budget_view_seconds`` - the budget view that listing data sets shows for each one.

Cost: building the 10,000-run history takes about 2-4 minutes per backend on a 2-core machine
(the full suite under 10 minutes); the quick form (10 and 200 runs, SQLite only) well under a minute.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.harness import SuiteUnavailable, make_row

if TYPE_CHECKING:
    from dp_accounting.dp_event import DpEvent
    from sqlalchemy.orm import Session

SUITE = "ledger"
SIZES = (10, 1_000, 10_000)
QUICK_SIZES = (10, 200)
BACKENDS = ("sqlite", "postgresql")
DELTA = 1e-6
CAP = 20.0
MULTIPLIER = 400.0
STEPS = 4
N_ITEMS = 20
BATCH = 200
REPEATS = 5


def _run_event() -> DpEvent:
    """The charged event of one simulated run (DPALS-shaped: counts, then STEPS x (Gram, linear))."""
    from dp_accounting import dp_event

    from app.core.privacy.accounting import compose, gaussian

    step = compose([gaussian(MULTIPLIER), gaussian(MULTIPLIER)])
    return compose([gaussian(MULTIPLIER), dp_event.SelfComposedDpEvent(step, STEPS)])


@contextmanager
def _database(backend: str) -> Iterator[str]:
    """A fresh migrated database of ``backend`` (dropped or deleted afterwards)."""
    from app.db.migrate import upgrade_head
    from app.db.session import dispose_engines

    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="privrec-ledger-bench-") as folder:
            url = f"sqlite:///{Path(folder) / 'ledger.db'}"
            upgrade_head(url)
            try:
                yield url
            finally:
                dispose_engines()
        return
    from benchmarks.ingest import _database as postgres_database  # one way to make a bench database

    url, drop = postgres_database()
    try:
        upgrade_head(url)
        yield url
    finally:
        drop()


def _setup(url: str) -> None:
    from app.db.session import session_scope
    from app.ledger import change_person_cap
    from app.schemas.ingest import ItemIn
    from app.services import budget, catalog

    with session_scope(url) as s:
        change_person_cap(s, name="all", new_cap=CAP, reason="benchmark", actor="bench")
        budget.ensure_dataset(s, "bench", rating_min=1.0, rating_max=5.0, epsilon_cap=CAP, delta=DELTA)
        for k in range(N_ITEMS):
            catalog.upsert_item(s, dataset="bench", item_id=f"item-{k}", data=ItemIn(title=f"Item {k}"))


def _reserve(session: Session, event: DpEvent) -> None:
    from app import ledger
    from app.db.models import TrainingRun
    from app.services.budget import get_dataset

    ds = get_dataset(session, "bench")
    run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=0.0, delta=DELTA)
    session.add(run)
    session.flush()
    ledger.reserve(session, dataset=ds, event=event, parameters={}, actor="bench", run_id=run.id)


def _grow(url: str, event: DpEvent, count: int) -> None:
    """Append ``count`` charged runs through the ledger's append path, ``BATCH`` per transaction."""
    from app.db.session import session_scope

    while count > 0:
        with session_scope(url) as s:
            for _ in range(min(BATCH, count)):
                _reserve(s, event)
        count -= BATCH


def _median_seconds(action: Callable[[], object], repeats: int = REPEATS) -> float:
    """Median wall time of ``repeats`` calls after one untimed warm-up call (caches, compiled SQL)."""
    action()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(url: str, event: DpEvent) -> dict[str, float]:
    from app.db.session import session_scope
    from app.services.budget import get_budget
    from app.services.training.projection import project_run

    def reservation() -> None:
        with session_scope(url) as s:
            _reserve(s, event)

    def projection() -> None:
        with session_scope(url) as s:
            project_run(s, dataset="bench", epsilon=1.0)

    def view() -> None:
        with session_scope(url) as s:
            get_budget(s, dataset="bench")

    return {"reservation_seconds": _median_seconds(reservation), "projection_seconds": _median_seconds(projection),
            "budget_view_seconds": _median_seconds(view)}


def run_sizes(sizes: Sequence[int], backends: Sequence[str] = BACKENDS) -> list[dict]:
    """The suite's rows for histories of ``sizes`` charged runs on each reachable backend."""
    event = _run_event()
    rows: list[dict] = []
    for backend in backends:
        try:
            with _database(backend) as url:
                _setup(url)
                charged, baseline = 0, dict[str, float]()
                for n in sorted(sizes):
                    _grow(url, event, n - charged)
                    charged = n
                    timings = _measure(url, event)
                    charged += REPEATS + 1  # the timed (and warm-up) reservations are charged too
                    for metric, seconds in timings.items():
                        baseline.setdefault(metric, seconds)
                        rows.append(make_row(SUITE, f"{backend}-{n}-runs", "ledger", metric, seconds, delta=DELTA,
                                             baseline=baseline[metric], seconds=seconds))
        except SuiteUnavailable:
            if backend == "sqlite":
                raise
    return rows


def run(quick: bool) -> list[dict]:
    """Quick: 10 and 200 runs on SQLite; full: 10, 1,000 and 10,000 runs on SQLite and PostgreSQL."""
    return run_sizes(QUICK_SIZES, ("sqlite",)) if quick else run_sizes(SIZES)
