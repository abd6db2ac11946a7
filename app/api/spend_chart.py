"""The dashboard's spend chart: a server-rendered SVG over real time (UTC).

One point per charge (a run at its last ledger entry: committed, refunded or still reserved; a
local guarantee at its entry), the composed spend as a step line through them, the data set's cap
and its person budget's cap as horizontal step lines, and every cap change in the window marked
(the data set's from its ledger, the person budget's from its own hash-chained entries). Only
numbers, times and audited actor names (escaped) reach the markup; its colours come from the
page's stylesheet (classes), so the page's Content-Security-Policy needs nothing inline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

__all__ = ["Charge", "CapStep", "charges", "chart_svg", "time_ticks"]

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 44, 130, 26, 40
MIN_SPAN = timedelta(minutes=1)
MAX_TICKS = 6
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 91 * 86400, 182 * 86400, 365 * 86400)
OUTCOMES = {"commit": "committed", "refund": "refunded", "reservation": "reserved", "local": "local guarantee"}


@dataclass(frozen=True)
class Charge:
    """One point of the chart: a run's last entry in the window, or a local guarantee."""

    at: datetime
    spent: float
    seq: int
    kind: str
    run_id: int | None


@dataclass(frozen=True)
class CapStep:
    """A cap taking ``new`` at ``at`` (``old`` None: where the line starts)."""

    at: datetime
    new: float
    old: float | None
    scope: str  # "dataset" | "person"
    actor: str


def when(value: Any) -> datetime:
    """An ISO-8601 text or a datetime as an aware UTC datetime (naive values are UTC)."""
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def charges(entries: Sequence[dict[str, Any]]) -> list[Charge]:
    """The points: each run once (at its last entry: a reservation's commit or refund replaces it)
    and each local guarantee, in ledger order."""
    points: dict[tuple[str, int], Charge] = {}
    for e in entries:
        kind = str(e["kind"])
        if kind not in OUTCOMES or (kind != "local" and e.get("run_id") is None):
            continue
        key = ("run", int(e["run_id"])) if kind != "local" else ("local", int(e["seq"]))
        points.pop(key, None)  # re-inserted last: dict order is the order of each point's entry
        points[key] = Charge(at=when(e["created_at"]), spent=float(e.get("spent_epsilon_rdp") or 0.0),
                             seq=int(e["seq"]), kind=kind, run_id=None if kind == "local" else int(e["run_id"]))
    return sorted(points.values(), key=lambda c: c.seq)


def dataset_caps(entries: Sequence[dict[str, Any]]) -> list[CapStep]:
    """The data set's cap over the window: its value at the first entry, then each change."""
    steps: list[CapStep] = []
    for e in entries:
        cap = e.get("epsilon_cap")
        if cap is None:
            continue
        if not steps:
            steps.append(CapStep(when(e["created_at"]), float(cap), None, "dataset", str(e.get("actor") or "")))
        elif e["kind"] == "cap_change" or float(cap) != steps[-1].new:
            steps.append(CapStep(when(e["created_at"]), float(cap), steps[-1].new, "dataset", str(e.get("actor") or "")))
    return steps


def person_caps(history: Iterable[dict[str, Any]], start: datetime) -> list[CapStep]:
    """The person budget's cap from its hash-chained entries: the value in force at ``start`` (or at
    its creation, when later), then each change after it."""
    steps: list[CapStep] = []
    for h in sorted(history, key=lambda h: int(h.get("seq") or 0)):
        at, new = when(h["at"]), float(h["new_cap"])
        step = CapStep(at, new, None if h.get("old_cap") is None else float(h["old_cap"]), "person",
                       str(h.get("actor") or ""))
        if at <= start:
            steps = [CapStep(start, new, None, "person", step.actor)]
        else:
            steps.append(step if steps else CapStep(at, new, None, "person", step.actor))
    return steps


def time_ticks(t0: datetime, t1: datetime) -> tuple[list[datetime], int]:
    """At most :data:`MAX_TICKS` round UTC times in [t0, t1] and the step between them (seconds)."""
    span = (t1 - t0).total_seconds()
    step = next((s for s in TICK_STEPS_S if span / s <= MAX_TICKS), TICK_STEPS_S[-1])
    first = math.ceil(t0.timestamp() / step) * step
    ticks = []
    t = first
    while t <= t1.timestamp():
        ticks.append(datetime.fromtimestamp(t, UTC))
        t += step
    return ticks, step


def tick_label(at: datetime, step_s: int, previous: datetime | None) -> str:
    """A readable UTC label: seconds for short spans, the day when it changes (and on the first)."""
    if step_s >= 86400:
        return at.strftime("%d %b %Y") if previous is None or previous.year != at.year else at.strftime("%d %b")
    clock = at.strftime("%H:%M:%S" if step_s < 60 else "%H:%M")
    return clock if previous is not None and previous.date() == at.date() else f"{at.strftime('%d %b')} {clock}"


def _nice_top(value: float) -> float:
    """The smallest round number (1, 1.2, 1.6, 2, ... 8 x 10^k) at least ``value`` (the y axis' top;
    its quarters are the y ticks)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8, 10) if m * power >= value)


@dataclass(frozen=True)
class _Frame:
    t0: datetime
    t1: datetime
    top: float

    def x(self, at: datetime) -> float:
        share = (at - self.t0).total_seconds() / max((self.t1 - self.t0).total_seconds(), 1e-9)
        return LEFT + (WIDTH - LEFT - RIGHT) * min(max(share, 0.0), 1.0)

    def y(self, v: float) -> float:
        return HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * (v / self.top)


def _num(v: float) -> str:
    """An ε as the API reports it (at most six decimals, no trailing zeros)."""
    return f"{v:.6f}".rstrip("0").rstrip(".")


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def _step_line(f: _Frame, steps: Sequence[tuple[datetime, float]], end: datetime) -> str:
    """Points of a step line: each value held until the next one's time, the last until ``end``."""
    pts: list[str] = []
    for i, (at, v) in enumerate(steps):
        if i:
            pts.append(f"{f.x(at):.1f},{f.y(steps[i - 1][1]):.1f}")
        pts.append(f"{f.x(at):.1f},{f.y(v):.1f}")
    if steps:
        pts.append(f"{f.x(end):.1f},{f.y(steps[-1][1]):.1f}")
    return " ".join(pts)


def _axes(f: _Frame) -> str:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/>',
           f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}"/>']
    ticks, step = time_ticks(f.t0, f.t1)
    previous: datetime | None = None
    for at in ticks:
        x = f.x(at)
        out.append(f'<g class="tick x" data-at="{at.isoformat()}"><line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" '
                   f'y2="{bottom + 5}"/><text x="{x:.1f}" y="{bottom + 17}" text-anchor="middle">'
                   f'{tick_label(at, step, previous)}</text></g>')
        previous = at
    out.append(f'<text class="axis-title" x="{WIDTH - 4}" y="{bottom + 34}" text-anchor="end">x: time (UTC)</text>')
    for k in range(5):
        v = f.top * k / 4
        out.append(f'<g class="tick y"><line x1="{LEFT - 4}" y1="{f.y(v):.1f}" x2="{LEFT}" y2="{f.y(v):.1f}"/>'
                   f'<text x="{LEFT - 6}" y="{f.y(v) + 4:.1f}" text-anchor="end">{v:g}</text></g>')
    out.append(f'<text class="axis-title" x="{LEFT}" y="{TOP - 10}" text-anchor="start">ε spent (RDP)</text>')
    return "".join(out)


def _cap_lines(f: _Frame, dataset: list[CapStep], person: list[CapStep], end: datetime) -> str:
    out: list[str] = []
    used: list[float] = []
    for scope, steps, name in (("dataset", dataset, "data set cap"), ("person", person, "person cap")):
        if not steps:
            continue
        line = _step_line(f, [(s.at, s.new) for s in steps], end)
        y = f.y(steps[-1].new)
        while any(abs(y - u) < 12 for u in used):  # keep the two labels apart
            y += 12
        used.append(y)
        out.append(f'<g class="cap cap-{scope}" data-cap="{_num(steps[-1].new)}"><polyline points="{line}"/>'
                   f'<text x="{WIDTH - RIGHT + 6}" y="{y + 4:.1f}">{name} {_num(steps[-1].new)}</text></g>')
    for s in [*dataset, *person]:
        if s.old is None:
            continue
        x = f.x(s.at)
        who = "data set" if s.scope == "dataset" else "person budget"
        out.append(f'<g class="cap-change scope-{s.scope}" data-at="{s.at.isoformat()}" data-new="{_num(s.new)}">'
                   f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}"/>'
                   f'<path d="M{x - 5:.1f},{TOP - 8} L{x + 5:.1f},{TOP - 8} L{x:.1f},{TOP} Z"/>'
                   f'<title>{who} cap {_num(s.old)} → {_num(s.new)} by {escape(s.actor)} at {_stamp(s.at)}</title></g>')
    return "".join(out)


def _points(f: _Frame, points: list[Charge], start_spent: float, end: datetime) -> str:
    steps = [(f.t0, start_spent)] + [(c.at, c.spent) for c in points]
    out = [f'<polyline class="spend" points="{_step_line(f, steps, end)}"/>']
    for c in points:
        what = f"run {c.run_id}" if c.run_id is not None else f"entry #{c.seq}"
        run = f' data-run="{c.run_id}"' if c.run_id is not None else ""
        out.append(f'<circle class="pt outcome-{c.kind}"{run} data-seq="{c.seq}" data-at="{c.at.isoformat()}" '
                   f'cx="{f.x(c.at):.1f}" cy="{f.y(c.spent):.1f}" r="4"><title>{what} {OUTCOMES[c.kind]} at '
                   f'{_stamp(c.at)}: spent {_num(c.spent)}</title></circle>')
    return "".join(out)


def _legend() -> str:
    items = [("pt outcome-commit", "run committed"), ("pt outcome-refund", "run refunded"),
             ("pt outcome-reservation", "run reserved"), ("pt outcome-local", "local guarantee")]
    y = HEIGHT - BOTTOM + 30
    marks = "".join(f'<g class="legend" transform="translate({LEFT + 112 * k},{y})">'
                    f'<circle class="{cls}" r="4"/><text x="8" y="4">{label}</text></g>'
                    for k, (cls, label) in enumerate(items))
    return (f'{marks}<g class="legend cap-change" transform="translate({LEFT + 112 * len(items)},{y})">'
            f'<path d="M-5,-4 L5,-4 L0,4 Z"/><text x="8" y="4">cap change</text></g>')


def chart_svg(entries: Sequence[dict[str, Any]], person_history: Iterable[dict[str, Any]] = (),
              now: datetime | None = None) -> tuple[str, int]:
    """The chart of ``entries`` (ledger entries in sequence order, as JSON) up to ``now``, with the
    person budget's cap from ``person_history``; and its number of points (0: nothing charged, the
    page shows its empty state instead)."""
    if not entries:
        return "", 0
    points = charges(entries)
    t0 = when(entries[0]["created_at"])
    dataset = dataset_caps(entries)
    person = person_caps(person_history, t0)
    times = [t0, *(c.at for c in points), *(s.at for s in dataset), *(s.at for s in person)]
    t1 = max([*times, when(now or datetime.now(UTC))])
    t1 = max(t1, t0 + MIN_SPAN)
    first = entries[0]
    start_spent = 0.0 if first["kind"] == "open" else float(first.get("spent_epsilon_rdp") or 0.0)
    top = _nice_top(1.05 * max([start_spent, *(c.spent for c in points), *(s.new for s in dataset),
                                *(s.new for s in person)]))
    f = _Frame(t0, t1, top)
    svg = (f'<svg class="chart" width="{WIDTH}" height="{HEIGHT + 12}" viewBox="0 0 {WIDTH} {HEIGHT + 12}" '
           f'role="img" aria-label="privacy spend over time (UTC), caps and cap changes">'
           f'{_axes(f)}{_cap_lines(f, dataset, person, t1)}{_points(f, points, start_spent, t1)}{_legend()}</svg>')
    return svg, len(points)
