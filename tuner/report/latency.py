"""The report's latency: p50/p90/p99 of TTFT, inter-token latency, end-to-end and queue time per
setting (each setting's settled time) and over time (windows of WINDOW_S), from both sources of
tuner.core.latency (the load driver's exact timings, the server histogram's buckets), as JSON data
and as markdown lines and HTML (tables and a chart of the p99s over time).

Pure over RecordingData and the summary's segments; must not read a server, import textual or
compute a percentile itself (tuner.core.latency.window_readout does).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from tuner.core import timeline as T
from tuner.core.events import EventKind
from tuner.core.latency import LABELS, ms_text, window_readout
from tuner.core.segments import Segment, setting_label
from tuner.report.data import RecordingData

WINDOW_S = 30.0
"""The over-time windows: as the TUI's latency panel, long enough for a p99 at a modest --rate."""
EVENT_KINDS = (EventKind.LOAD_REQUEST, EventKind.LATENCY_BUCKETS, EventKind.LATENCY_UNAVAILABLE)
MAX_MD_WINDOWS = 60
"""Markdown rows over time at most (the HTML chart has them all)."""
SETTING_HEAD = ["setting", "from", "requests", "TTFT p50", "TTFT p99", "ITL p50", "ITL p90", "ITL p99",
                "e2e p99", "queue p99", "server ITL p99", "server TTFT p99"]
TIME_HEAD = ["from", "requests", "ITL p99", "TTFT p99", "e2e p99", "server ITL p99", "server TTFT p99"]
NOTE = ("Load driver: exact percentiles of the requests wholly inside the span (ITL is SGLang's: each "
        "output's gap spread over its new tokens). Server: the histogram bucket the percentile falls in, "
        "from bucket deltas between scrapes.")


def latency_of(data: RecordingData, segments: Sequence[Segment]) -> dict[str, Any] | None:
    """{"window_s", "settings": [{"setting", "t0", "t1", **window_readout}] over each segment's settled
    time, "over_time": [{"t0", "t1", **window_readout}], "unavailable": the server's reason or None};
    None when the recording has no latency event (made before latency was recorded, or no traffic)."""
    if not data.events(EVENT_KINDS):
        return None
    settings = []
    for seg in segments:
        t0 = T.settle_end(data, seg.t0)
        t1 = min(seg.t1, data.t_last)
        if not t0 < t1:
            continue
        r = window_readout(data.events(EVENT_KINDS, seg.t0, t1), t0, t1)
        if r["requests"] or r["server"]:
            settings.append({"setting": setting_label(seg.key), "t0": seg.t0, "t1": t1, **r})
    over = []
    t = data.t_first
    while math.isfinite(t) and t < data.t_last:
        b = min(t + WINDOW_S, data.t_last)
        r = window_readout(data.events(EVENT_KINDS, t, b), t, b)
        if r["requests"] or r["server"]:
            over.append({"t0": t, "t1": b, **r})
        t = b
    gone = data.events(EventKind.LATENCY_UNAVAILABLE)
    return {"window_s": WINDOW_S, "settings": settings, "over_time": over,
            "unavailable": str(gone[-1].data.get("reason", "")) if gone else None}


def _exact(r: dict[str, Any], kind: str, q: str) -> str:
    v = ((r.get("driver") or {}).get(kind) or {}).get(q)
    return ms_text(v) if isinstance(v, (int, float)) else "–"


def _bucket(r: dict[str, Any], kind: str, q: str = "p99") -> str:
    b = ((r.get("server") or {}).get(kind) or {}).get(q)
    if not b:
        return "–"
    return f"≤ {ms_text(b[1])}" if b[1] is not None else f"> {ms_text(b[0])}"


def setting_rows(lat: dict[str, Any], clock: Any) -> list[list[str]]:
    """SETTING_HEAD rows; `clock(t)` words a recording time (m:ss from the start)."""
    return [[s["setting"], clock(s["t0"]), str(s["requests"]), _exact(s, "ttft", "p50"), _exact(s, "ttft", "p99"),
             _exact(s, "itl", "p50"), _exact(s, "itl", "p90"), _exact(s, "itl", "p99"), _exact(s, "e2e", "p99"),
             _exact(s, "queue", "p99"), _bucket(s, "itl"), _bucket(s, "ttft")] for s in lat["settings"]]


def time_rows(lat: dict[str, Any], clock: Any) -> list[list[str]]:
    return [[clock(w["t0"]), str(w["requests"]), _exact(w, "itl", "p99"), _exact(w, "ttft", "p99"),
             _exact(w, "e2e", "p99"), _bucket(w, "itl"), _bucket(w, "ttft")] for w in lat["over_time"]]


def markdown(lat: dict[str, Any] | None, table: Any, clock: Any, esc: Any) -> list[str]:
    """The "Latency" section's lines (`table(head, rows)` and `esc` are the markdown renderer's)."""
    if lat is None:
        return []
    out = ["## Latency", ""]
    if lat["unavailable"]:
        out += [f"> Server: {esc(lat['unavailable'])}", ""]
    if lat["settings"]:
        out += ["### Per setting (settled time)", "", table(SETTING_HEAD, setting_rows(lat, clock)), ""]
    rows = time_rows(lat, clock)
    if rows:
        more = f" (the first {MAX_MD_WINDOWS} of {len(rows)})" if len(rows) > MAX_MD_WINDOWS else ""
        out += [f"### Over time ({lat['window_s']:g}-s windows){more}", "",
                table(TIME_HEAD, rows[:MAX_MD_WINDOWS]), ""]
    return out + [esc(NOTE), ""]


def html(lat: dict[str, Any] | None, table: Any, clock: Any, esc: Any, chart: Any) -> str:
    """The "Latency" section: the per-setting table, p99 ITL and TTFT over time as charts
    (`chart(title, [(label, t, v in ms)], y_label)` is the HTML renderer's), the over-time table folded."""
    if lat is None:
        return ""
    out = ["<h2>Latency</h2>"]
    if lat["unavailable"]:
        out.append(f'<p class="note">Server: {esc(lat["unavailable"])}</p>')
    if lat["settings"]:
        out.append("<h3>Per setting (settled time)</h3>" + table(SETTING_HEAD, [[esc(c) for c in r]
                                                                                for r in setting_rows(lat, clock)]))
    over = lat["over_time"]
    if over:
        for kind in ("itl", "ttft"):
            exact = [((w["driver"].get(kind) or {}).get("p99") or math.nan) * 1e3 for w in over]
            bound = [_bound_ms(w, kind) for w in over]
            lines = [(f"{LABELS[kind]} p99, load driver (exact)", *_steps(over, exact)),
                     (f"{LABELS[kind]} p99, server bucket's upper bound", *_steps(over, bound))]
            out.append(chart(f"{LABELS[kind]} p99 over time ({lat['window_s']:g}-s windows)", lines, "ms"))
        out.append("<details><summary>Over time, as a table</summary>"
                   + table(TIME_HEAD, [[esc(c) for c in r] for r in time_rows(lat, clock)]) + "</details>")
    out.append(f'<p class="note">{esc(NOTE)}</p>')
    return "".join(out)


def _steps(over: Sequence[dict[str, Any]], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """A window's figure held across the window, as points a few seconds apart: the chart joins
    points closer than 5 s and breaks the line at a window with no figure."""
    ts: list[float] = []
    vs: list[float] = []
    for w, v in zip(over, values):
        n = max(1, math.ceil((w["t1"] - w["t0"]) / 2.5))
        ts += [w["t0"] + (w["t1"] - w["t0"]) * i / n for i in range(n + 1)]
        vs += [v] * (n + 1)
    return ts, vs


def _bound_ms(w: dict[str, Any], kind: str) -> float:
    b = ((w.get("server") or {}).get(kind) or {}).get("p99")
    return b[1] * 1e3 if b and b[1] is not None else math.nan
