"""The report's latency section over a real recording file (tests/report/synthetic.py plus load-driver
timings and server histogram deltas): per setting over its settled time, over time, in JSON, markdown
and HTML; a recording without latency events has no section."""

from __future__ import annotations

import pytest
from synthetic import CHANGE_AT, T0, write

from tuner.core import latency as L
from tuner.core.events import EventKind
from tuner.core.records import Event
from tuner.report import html, markdown
from tuner.report.data import load
from tuner.report.summary import summarize


def timings(itl_s: float, start: float, end: float) -> list[Event]:
    """A request every second in [start, end): TTFT 0.1 s, then 4 outputs of 2 tokens, ITL `itl_s`."""
    out, t = [], start
    while t < end:
        r = L.RequestTiming(T0 + t, 0.1, 0.1 + 8 * itl_s, 9, ((2 * itl_s, 2),) * 4)
        out.append(Event(r.sent + r.e2e, EventKind.LOAD_REQUEST, r.to_data()))
        t += 1.0
    return out


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    buckets = [Event(T0 + t, EventKind.LATENCY_BUCKETS, {"itl": L.buckets_data({(0.02, 0.04): 10.0})})
               for t in (10.0, 20.0, 65.0)]
    path = write(tmp_path_factory.mktemp("lat") / "lat.db",
                 extra=[*timings(0.01, 5.0, 25.0), *timings(0.03, CHANGE_AT + 5, 44.0), *buckets])
    return summarize(load(path))


def test_per_setting_and_over_time_from_both_sources(summary):
    lat = summary.latency
    first, second = lat["settings"][:2]
    assert first["driver"]["itl"]["p99"] == pytest.approx(0.01)
    assert second["driver"]["itl"]["p99"] == pytest.approx(0.03)
    assert first["server"]["itl"]["p99"] == [0.02, 0.04]
    assert first["driver"]["ttft"]["p50"] == pytest.approx(0.1)
    assert [round(w["t0"] - T0) for w in lat["over_time"]] == [0, 30, 60]
    assert summary.to_json()["latency"] == lat


def test_markdown_and_html_sections(summary):
    md = markdown.render(summary)
    assert "## Latency" in md and "### Per setting (settled time)" in md
    assert "| 10 ms |" in md and "| 30 ms |" in md and "≤ 40 ms" in md
    page = html.render(summary)
    assert "<h2>Latency</h2>" in page and "ITL p99 over time (30-s windows)" in page and "≤ 40 ms" in page


def test_no_latency_events_no_section(tmp_path):
    s = summarize(load(write(tmp_path / "plain.db")))
    assert s.latency is None and "## Latency" not in markdown.render(s) and "<h2>Latency</h2>" not in html.render(s)
