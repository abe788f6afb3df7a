"""`report --prometheus URL --from T --to T`: a server's time in Prometheus as the data a report is
built from (tuner.report.data.RecordingData), so the report is the same builder over other readings.

One range query fetches every `sglang:*` and `specdecode:*` series of the one server the selector
picks; each step's values become a MetricSet, fed to tuner.backends.derive's MetricsDeriver (the
live /metrics path), so tok/s, acceptance and the phase split are derived exactly as a recording's.
The active setting (steps, topk, draft tokens, placement) read at each step makes the
`config_changed` events a report cuts settings at; a step where the server has no series is an
outage (`disconnected` .. `connected`). What Prometheus never had (client-side tok/s, batch sizes per
iteration, traces, NVML) is simply absent from the report, as in a recording without it.
Must not write anything; PrometheusError (one line) for every failure.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from probes.names import PLACEMENT
from tuner.backends.base import DRAFT_TOKENS, STEPS, TOPK
from tuner.backends.derive import MetricsDeriver
from tuner.backends.promtext import MetricSet
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.fleet.prometheus import Matcher, PrometheusClient, PrometheusError, parse_selector
from tuner.report.data import RecordingData, Series

MAX_POINTS = 2000          # per series: Prometheus refuses more than 11,000
DROP_LABELS = ("__name__", "instance", "job")


def parse_time(text: str, now: float) -> float:
    """Unix seconds from `1767225600`, RFC 3339 (`2026-01-01T00:00:00Z`), `now`, or `now-15m` / `15m`
    (that long ago); PrometheusError (rc 2) otherwise."""
    from tuner.commands.duration import DurationError, parse_duration

    s = str(text).strip()
    if s == "now":
        return now
    m = re.fullmatch(r"(?:now\s*-\s*)?(.+)", s)
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    except ValueError:
        pass
    try:
        return now - parse_duration(m.group(1) if m else s)
    except DurationError:
        raise PrometheusError(f"not a time: {s!r} (Unix seconds, RFC 3339, now, or now-15m)", 2) from None


def promql_selector(matchers: list[Matcher]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"')
    return ",".join(f'{m.name}{m.op}"{esc(m.value)}"' for m in matchers)


def active_of(ms: MetricSet) -> dict[str, Any]:
    """The active setting as server-arg names, from the gauges both servers export."""
    def whole(name: str) -> int | None:
        v = ms.value(name)
        return int(v) if math.isfinite(v) else None
    active: dict[str, Any] = {STEPS: whole("sglang:spec_num_steps"), TOPK: whole("specdecode:spec_eagle_topk"),
                              DRAFT_TOKENS: whole("sglang:spec_num_draft_tokens")}
    placed = [lab.get("placement") for lab, v in ms.samples("specdecode:draft_placement") if v == 1]
    if placed:
        active[PLACEMENT] = placed[0]
    return {k: v for k, v in active.items() if v is not None}


def build(matrix: list[tuple[dict[str, str], list[tuple[float, float]]]], start: float, end: float,
          step: float, where: str) -> RecordingData:
    """The range answer as RecordingData (times in seconds from `start`). Pure."""
    by_t: dict[float, dict[str, list[tuple[dict[str, str], float]]]] = {}
    for labels, points in matrix:
        name = labels.get("__name__", "")
        lab = {k: v for k, v in labels.items() if k not in DROP_LABELS}
        for t, v in points:
            by_t.setdefault(t, {}).setdefault(name, []).append((lab, v))
    deriver = MetricsDeriver()
    series: dict[str, Series] = {}
    events: list[Event] = []
    header: dict[str, Any] = {"backend": "prometheus", "url": where, "command": "report --prometheus",
                              "created_at": time.time(), "t0_unix": start}

    def add(s: Sample) -> None:
        ser = series.setdefault(s.series, Series(s.series))
        ser.t.append(s.t)
        ser.v.append(s.value)

    active_prev: dict[str, Any] | None = None
    t_prev: float | None = None
    iters0: float | None = None
    ticks = sorted(by_t)
    for t_abs in ticks:
        t = t_abs - start
        if t_prev is not None and t - t_prev > 1.5 * step:
            # No series at all between two steps: Prometheus did not reach the server then.
            events.append(Event(t_prev, EventKind.DISCONNECTED, {"since": t_prev, "error": "no series in Prometheus"}))
            events.append(Event(t, EventKind.CONNECTED, {}))
            deriver.reset()
        ms = MetricSet(by_t[t_abs])
        active = active_of(ms)
        if active_prev is None:
            header["active"] = active
        elif active and active != active_prev:
            events.append(Event(t, EventKind.CONFIG_CHANGED, {"old": active_prev, "new": active, "by": "prometheus"}))
        active_prev = active or active_prev
        for s in deriver.update(t, ms, active):
            add(s)
        it = ms.value("specdecode:iterations_total", rank="0")
        if math.isfinite(it):
            iters0 = it if iters0 is None or it < iters0 else iters0
            add(Sample(t, S.SERVER_ITERATIONS, it - iters0))
        t_prev = t
    if not ticks:
        raise PrometheusError(f"{where}: no sglang:* or specdecode:* series between the two times")
    return RecordingData(Path(f"prometheus-{re.sub(r'[^A-Za-z0-9_.-]+', '_', where)[:80]}"), header, series,
                         events, [], [], ticks[0] - start, ticks[-1] - start)


def load(url: str, selector: str | None, t_from: float, t_to: float, step: float | None = None) -> RecordingData:
    """One server's series between two Unix times as RecordingData; PrometheusError otherwise."""
    if not t_to > t_from:
        raise PrometheusError("--to must be after --from", 2)
    matchers = parse_selector(selector)
    step = step or max(1.0, math.ceil((t_to - t_from) / MAX_POINTS))
    sel = promql_selector(matchers)
    query = '{__name__=~"(sglang|specdecode):.+"' + ("," + sel if sel else "") + "}"
    with PrometheusClient(url, deadline=30.0) as client:
        matrix = client.query_range(query, t_from, t_to, step)
    instances = sorted({lab.get("instance", "") for lab, _ in matrix})
    if len(instances) > 1:
        raise PrometheusError(f"--selector {selector or '{}'} matches {len(instances)} servers "
                              f"({', '.join(instances[:4])}{', ...' if len(instances) > 4 else ''}); "
                              "pick one, e.g. {instance=\"" + instances[0] + "\"}", 2)
    if not instances:
        raise PrometheusError(f"{client.where}: no sglang:* or specdecode:* series match "
                              f"{selector or '{}'} between the two times")
    return build(matrix, t_from, t_to, step, instances[0])
