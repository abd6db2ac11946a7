"""The dashboard's spend chart: one point per run (at its last entry), a UTC time axis with
readable ticks, both caps drawn as step lines and every cap change in the window marked."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from app.api.spend_chart import chart_svg, tick_label, time_ticks

T0 = datetime(2026, 11, 27, 9, 58, tzinfo=UTC)


def _entry(seq: int, kind: str, seconds: float, spent: float, cap: float = 10.0, run_id: int | None = None,
           actor: str = "admin:root") -> dict[str, object]:
    return {"seq": seq, "kind": kind, "run_id": run_id, "created_at": (T0 + timedelta(seconds=seconds)).isoformat(),
            "spent_epsilon_rdp": spent, "epsilon_cap": cap, "actor": actor}


LEDGER = [
    _entry(1, "open", 0, 0.0),
    _entry(2, "reservation", 60, 1.2, run_id=1),
    _entry(3, "reservation", 70, 2.3, run_id=2),
    _entry(4, "commit", 90, 2.2, run_id=1),
    _entry(5, "refund", 100, 1.1, run_id=2),
    _entry(6, "local", 110, 1.6),
    _entry(7, "cap_change", 120, 1.6, cap=20.0, actor="<script>x</script>"),
    _entry(8, "reservation", 130, 2.5, cap=20.0, run_id=3),
]
PERSON = [{"seq": 1, "at": (T0 - timedelta(days=3)).isoformat(), "old_cap": None, "new_cap": 10.0, "actor": "migration"},
          {"seq": 2, "at": (T0 + timedelta(seconds=125)).isoformat(), "old_cap": 10.0, "new_cap": 5.123456,
           "actor": "admin:root"}]


def test_one_point_per_run_at_its_last_entry() -> None:
    svg, points = chart_svg(LEDGER, PERSON, now=T0 + timedelta(minutes=5))
    runs = re.findall(r'<circle class="pt outcome-(\w+)" data-run="(\d+)" data-seq="(\d+)"', svg)
    assert runs == [("commit", "1", "4"), ("refund", "2", "5"), ("reservation", "3", "8")]
    assert len(re.findall(r'<circle class="pt outcome-local" data-seq="6"', svg)) == 1
    assert points == 4


def test_time_axis_caps_and_cap_changes() -> None:
    svg, _ = chart_svg(LEDGER, PERSON, now=T0 + timedelta(minutes=5))
    labels = re.findall(r'<g class="tick x" data-at="[^"]+">.*?<text[^>]*>([^<]+)</text>', svg)
    assert labels[0] == "27 Nov 09:58" and labels[1:] == ["09:59", "10:00", "10:01", "10:02", "10:03"]
    assert 'data-cap="20"' in svg and 'data-cap="5.123456"' in svg and "person cap 5.123456" in svg
    changes = re.findall(r'<g class="cap-change scope-(\w+)" data-at="([^"]+)" data-new="([^"]+)"', svg)
    assert changes == [("dataset", (T0 + timedelta(seconds=120)).isoformat(), "20"),
                       ("person", (T0 + timedelta(seconds=125)).isoformat(), "5.123456")]
    assert "<script>" not in svg and "&lt;script&gt;" in svg  # audited names are escaped


def test_ticks_fit_the_span() -> None:
    for span in (timedelta(seconds=20), timedelta(hours=5), timedelta(days=40), timedelta(days=900)):
        ticks, step = time_ticks(T0, T0 + span)
        assert 1 <= len(ticks) <= 6 and all(T0 <= t <= T0 + span for t in ticks)
        assert all(tick_label(t, step, None) for t in ticks)
    assert tick_label(T0, 30, T0) == "09:58:00" and tick_label(T0, 86400, None) == "27 Nov 2026"


def test_nothing_charged() -> None:
    assert chart_svg([]) == ("", 0)
    svg, points = chart_svg(LEDGER[:1], now=T0)
    assert points == 0 and 'class="chart"' in svg
