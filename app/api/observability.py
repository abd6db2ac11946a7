"""Operations: Prometheus metrics and structured JSON logs with a request id.

* Every HTTP request gets an id (a safe incoming ``X-Request-ID`` or a fresh one), echoed in the
  ``X-Request-ID`` response header and attached to every log line written while it runs, and to
  the training task it starts (the log format and the id live in :mod:`app.logging_setup`).
* Request counts and latency histograms are labelled by route *template* (never the raw path,
  which can name users) and status. With ``PROMETHEUS_MULTIPROC_DIR`` set, every process
  (uvicorn workers, Celery workers) writes to that directory and ``/metrics`` aggregates them.
* Training runs by data set, algorithm and status, budget spent and cap per data set and the
  broker queue depth are read at scrape time from the database and the broker, so they agree
  across processes. No durations of training (they grow with the private data's size), no
  ratings, no data-derived numbers.
* ``GET /metrics`` needs an admin token: the numbers include private activity counts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import redis
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from app.api.deps import AdminPrincipal
from app.db.models import Dataset, TrainingRun
from app.errors import PrivrecError
from app.logging_setup import REQUEST_ID, JsonFormatter, configure_logging
from app.services import budget
from app.services.training import forecast as ahead
from app.services.training.dispatch import QUEUE

__all__ = ["REQUEST_ID", "REQUESTS", "LATENCY", "access_log", "JsonFormatter", "configure_logging", "router",
           "request_id"]

REQUESTS = Counter("privrec_http_requests_total", "HTTP requests by route template and status",
                   ["method", "route", "status"])
LATENCY = Histogram("privrec_http_request_duration_seconds", "Time inside the app per request",
                    ["method", "route"], buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))

access_log = logging.getLogger("privrec.access")


def request_id() -> str | None:
    """The id of the request being served (None outside requests)."""
    return REQUEST_ID.get()


# ----------------------------------------------------------------------------- /metrics
class _StateCollector:
    """Gauges read from the database and the broker at scrape time."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily("privrec_training_runs", "Training runs by data set, algorithm and status",
                                 labels=["dataset", "algorithm", "status"])
        spent = GaugeMetricFamily("privrec_budget_spent_epsilon", "Composed spend (RDP, rounded up)", labels=["dataset"])
        cap = GaugeMetricFamily("privrec_budget_cap_epsilon", "Epsilon cap", labels=["dataset"])
        payable = GaugeMetricFamily("privrec_payable_blocks", "Privacy blocks that could pay one more run like "
                                    "the data set's latest", labels=["dataset"])
        warning = GaugeMetricFamily("privrec_block_forecast_warning", "1 when the block forecast warns, at least 14 "
                                    "retrain intervals ahead: fewer payable blocks than the retrain policy's "
                                    "minimum (shortfall), or the legacy block retiring (legacy)",
                                    labels=["dataset", "reason"])
        short = GaugeMetricFamily("privrec_block_shortfall_runs", "Scheduled runs until fewer blocks than the retrain "
                                  "policy's minimum could pay one (0: the next; absent: not within the forecast)",
                                  labels=["dataset"])
        with self.request.app.state.sessionmaker() as session:
            rows = session.execute(
                select(Dataset.name, TrainingRun.algorithm, TrainingRun.status, func.count())
                .join(Dataset, Dataset.id == TrainingRun.dataset_id)
                .group_by(Dataset.name, TrainingRun.algorithm, TrainingRun.status)).all()
            for name, algorithm, status, n in rows:
                runs.add_metric([name, algorithm, status], float(n))
            for name in session.scalars(select(Dataset.name).order_by(Dataset.name)):
                view = budget.get_budget(session, dataset=name)
                spent.add_metric([name], view.spent_epsilon_rdp)
                cap.add_metric([name], view.epsilon_cap)
                payable.add_metric([name], float(budget.payable_blocks(session, dataset=name)[0]))
                _forecast_metrics(session, name, self.request.app.state.settings, warning, short)
        yield runs
        yield spent
        yield cap
        yield payable
        yield warning
        yield short
        depth = _queue_depth(self.request.app.state.settings)
        if depth is not None:
            q = GaugeMetricFamily("privrec_broker_queue_depth", "Training tasks waiting in the broker", labels=["queue"])
            q.add_metric(["privrec"], float(depth))
            yield q


def _forecast_metrics(session: Any, name: str, settings: Any, warning: GaugeMetricFamily,
                      short: GaugeMetricFamily) -> None:
    """The data set's block forecast as gauges (nothing when its next run cannot be built)."""
    try:
        f = ahead.forecast(session, dataset=name, settings=settings)
    except PrivrecError:
        return
    for reason in ("shortfall", "legacy"):
        warning.add_metric([name, reason], 1.0 if reason in f.reasons else 0.0)
    if f.shortfall_at is not None:
        short.add_metric([name], round((f.shortfall_at - f.next_run_at).total_seconds() / f.policy.interval_s))


def _queue_depth(settings: Any) -> int | None:
    """Length of the Celery queue in Redis (None in the embedded mode or when unreachable)."""
    if not settings.redis_url:
        return None
    try:
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
        return int(client.llen(QUEUE))
    except redis.RedisError:
        return None


def _registry(request: Request) -> CollectorRegistry:
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:  # one process: its own counters
        for collector in (REQUESTS, LATENCY):
            registry.register(collector)
    registry.register(_StateCollector(request))
    return registry


router = APIRouter(include_in_schema=False)


@router.get("/metrics")
def metrics(request: Request, _: AdminPrincipal) -> Response:
    """Prometheus text format (admin token only)."""
    return Response(generate_latest(_registry(request)), media_type=CONTENT_TYPE_LATEST)
