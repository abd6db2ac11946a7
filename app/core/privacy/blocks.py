"""The public calendar of user-level privacy blocks.

Each user belongs to one *cohort*: the UTC calendar period (a month by default, a day for short
deployments and simulations) in which her user row was first created. Block accounts exist for
every period from the deployment's first one up to the current one, plus :data:`LEGACY` (the users
who existed before blocks did): the set of blocks is a function of the calendar and the clock
only, never of the data. Pure functions; the clock is always passed in.

The *privacy unit* a data set declares at creation says what a block holds. :data:`USER` (the
default): a user with all of her data, in the block of her cohort. :data:`USER_PERIOD`: one user's
ratings created in one period (user-time privacy), in the block of that period, whatever her cohort;
:func:`period_ranges` gives the creation times a block's ratings lie in.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

__all__ = ["LEGACY", "PERIODS", "USER", "USER_PERIOD", "PRIVACY_UNITS", "UNIT_LABELS", "cohort_of", "cohorts_until",
           "cohort_order", "check_period", "period_ranges", "period_start", "next_period_start"]

LEGACY = "legacy"
PERIODS = ("month", "day")
USER = "user"
USER_PERIOD = "user_period"
PRIVACY_UNITS = (USER, USER_PERIOD)
UNIT_LABELS = {USER: "per user", USER_PERIOD: "per user per period"}
"""How every number of a budget of each unit is read (the budget views show it)."""


def check_period(period: str) -> str:
    """``period`` when it is a known block period, else ``ValueError``."""
    if period not in PERIODS:
        raise ValueError(f"a block period is one of {', '.join(PERIODS)}, not {period!r}")
    return period


def _utc_date(moment: datetime) -> date:
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.date()  # a naive moment is read as UTC (SQLite returns them so)


def cohort_of(moment: datetime, period: str) -> str:
    """The label of the period holding ``moment`` (UTC): ``YYYY-MM`` or ``YYYY-MM-DD``; labels of
    one period kind sort chronologically."""
    day = _utc_date(moment)
    return f"{day.year:04d}-{day.month:02d}" if check_period(period) == "month" else day.isoformat()


def _next(label: str, period: str) -> str:
    if period == "month":
        year, month = int(label[:4]), int(label[5:7])
        return f"{year + month // 12:04d}-{month % 12 + 1:02d}"
    return (date.fromisoformat(label) + timedelta(days=1)).isoformat()


def period_start(label: str, period: str) -> datetime:
    """The UTC moment the period ``label`` (not :data:`LEGACY`) begins."""
    check_period(period)
    day = date(int(label[:4]), int(label[5:7]), 1) if period == "month" else date.fromisoformat(label)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def next_period_start(now: datetime, period: str) -> tuple[str, datetime]:
    """(the label of the period after the one holding ``now``, the UTC moment it begins): when the
    next block opens."""
    label = _next(cohort_of(now, period), period)
    return label, period_start(label, period)


def cohorts_until(start: str, now: datetime, period: str) -> list[str]:
    """Every block of the calendar at ``now``: :data:`LEGACY`, then each period from ``start``
    up to the one holding ``now`` (inclusive), in :func:`cohort_order`."""
    last = cohort_of(now, period)
    out, label = [LEGACY], start
    while label <= last:
        out.append(label)
        label = _next(label, period)
    return out


def cohort_order(label: str) -> tuple[int, str]:
    """Sort key of a cohort: :data:`LEGACY` first, then chronologically (the lock and charge order)."""
    return (0, "") if label == LEGACY else (1, label)


def _start_of(label: str) -> datetime:
    year, month = int(label[:4]), int(label[5:7])
    day = int(label[8:10]) if len(label) > 7 else 1
    return datetime(year, month, day, tzinfo=UTC)


def period_ranges(labels: list[str] | tuple[str, ...], start: str, period: str) -> list[tuple[datetime | None, datetime]]:
    """The creation times ``[lo, hi)`` (UTC) of the ratings in the blocks ``labels`` of a
    :data:`USER_PERIOD` data set, adjacent ranges merged, in order. The calendar's first period
    ``start`` also holds every earlier creation (``lo`` None), as the first cohort holds the users
    created before it; :data:`LEGACY` holds no rating (such a data set has nothing from before
    blocks)."""
    check_period(period)
    out: list[tuple[datetime | None, datetime]] = []
    for label in sorted({label for label in labels if label != LEGACY}):
        lo: datetime | None = None if label <= start else _start_of(label)
        hi = _start_of(_next(label, period))
        if out and lo is not None and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out
