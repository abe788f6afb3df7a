"""Exports for other tools: a Perfetto/Chrome trace of a recording, and CSV files for pandas.

Perfetto (ui.perfetto.dev opens Chrome's JSON trace format): every stored rank trace keeps its own
events (kernels, CPU ops, our phase spans), moved onto the recording's time axis and given its own
process ("rank N · capture ID"); the series become counter tracks; setting changes, server gaps and
other events become slices and instants on a "session" track. CSV: one long-format file of every
sample, one of events, one per-setting table. Must not import textual; reads only the recording.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Iterator

from probes.trace_stream import TraceFormatError, TraceReader
from tuner.core.records import thaw
from tuner.recording.outputs import write_atomic
from tuner.recording.schema import dumps
from tuner.report.data import RecordingData, trace_bytes
from tuner.core.segments import setting_label
from tuner.report.summary import Summary

SESSION_PID = 1
SERIES_PID = 2
FIRST_TRACE_PID = 100
CSV_FILES = ("samples.csv", "events.csv", "settings.csv")


def _us(s: Summary, t: float) -> float:
    return (t - s.data.t_first) * 1e6


def perfetto_events(s: Summary) -> Iterator[dict[str, Any]]:
    """The trace events, in no particular order (the viewer sorts)."""
    d = s.data
    yield {"ph": "M", "pid": SESSION_PID, "name": "process_name", "args": {"name": "session (settings, gaps, events)"}}
    yield {"ph": "M", "pid": SESSION_PID, "name": "process_sort_index", "args": {"sort_index": 0}}
    yield {"ph": "M", "pid": SESSION_PID, "tid": 1, "name": "thread_name", "args": {"name": "active setting"}}
    yield {"ph": "M", "pid": SESSION_PID, "tid": 2, "name": "thread_name", "args": {"name": "server gone"}}
    yield {"ph": "M", "pid": SESSION_PID, "tid": 3, "name": "thread_name", "args": {"name": "events"}}
    for seg in s.segments:
        yield {"ph": "X", "pid": SESSION_PID, "tid": 1, "name": setting_label(seg.key), "cat": "setting",
               "ts": _us(s, seg.t0), "dur": max(0.0, (seg.t1 - seg.t0) * 1e6), "args": {"source": seg.source}}
    for a, b, err in s.gaps:
        yield {"ph": "X", "pid": SESSION_PID, "tid": 2, "name": "server gone", "cat": "gap",
               "ts": _us(s, a), "dur": max(0.0, (b - a) * 1e6), "args": {"error": err}}
    for e in d.events():
        yield {"ph": "i", "s": "t", "pid": SESSION_PID, "tid": 3, "name": e.kind, "cat": "event",
               "ts": _us(s, e.t), "args": json.loads(dumps(thaw(e.data)))}
    yield {"ph": "M", "pid": SERIES_PID, "name": "process_name", "args": {"name": "series (counters)"}}
    yield {"ph": "M", "pid": SERIES_PID, "name": "process_sort_index", "args": {"sort_index": 1}}
    for name, ser in sorted(d.series.items()):
        for t, v in zip(ser.t, ser.v):
            if not math.isnan(v):
                yield {"ph": "C", "pid": SERIES_PID, "name": name, "ts": _us(s, t), "args": {"value": v}}


def trace_file_events(s: Summary, pid: int, trace: Any, problems: list[str]) -> Iterator[dict[str, Any]]:
    """One stored rank trace's events on the recording's time axis.

    A profiler's `ts` is microseconds from its own base: `baseTimeNanoseconds` (torch's metadata)
    when present, so epoch = base/1e9 + ts/1e6; without it the trace is placed so its last event
    ends when the capture was stored (the capture's event time)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json.gz" if trace.data[:2] == b"\x1f\x8b" else ".json") as f:
        f.write(trace.data)
        f.flush()
        try:
            reader = TraceReader(f.name)
            events = list(reader.events())
            meta = reader.meta
        except (TraceFormatError, OSError) as e:
            problems.append(f"trace {trace.name}: {e}")
            return
    base_ns = meta.get("baseTimeNanoseconds") if isinstance(meta, dict) else None
    ts_vals = [float(ev["ts"]) for ev in events if isinstance(ev, dict) and isinstance(ev.get("ts"), (int, float))]
    if not ts_vals:
        return
    if isinstance(base_ns, (int, float)) and base_ns > 0:
        shift = float(base_ns) / 1e3 - s.data.t_first * 1e6
    else:
        end = max(float(ev.get("ts", 0)) + float(ev.get("dur", 0) or 0) for ev in events
                  if isinstance(ev, dict) and isinstance(ev.get("ts"), (int, float)))
        shift = _us(s, trace.t) - end
    label = f"rank {trace.rank} · capture {trace.trace_id}"
    yield {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}}
    yield {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}
    tids: dict[Any, int] = {}
    for ev in events:
        if not isinstance(ev, dict):
            continue
        ev = dict(ev)
        if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_labels", "process_sort_index"):
            continue
        # Every rank file has its own pids (often equal across ranks): one process per rank file,
        # the original pid/tid pair kept apart as threads.
        key = (ev.get("pid"), ev.get("tid"))
        if key not in tids:
            tids[key] = len(tids) + 1
            yield {"ph": "M", "pid": pid, "tid": tids[key], "name": "thread_name",
                   "args": {"name": f"{'GPU' if isinstance(ev.get('pid'), int) and ev.get('pid') < 100 else 'pid'} "
                                    f"{ev.get('pid')} · {ev.get('tid')}"}}
        ev["pid"], ev["tid"] = pid, tids[key]
        if isinstance(ev.get("ts"), (int, float)):
            ev["ts"] = float(ev["ts"]) + shift
        yield ev


def write_perfetto(s: Summary, out: Path) -> list[str]:
    """Write the trace (through a temporary file renamed over `out`); returns problems met
    (unreadable stored traces), one line each. Raises OutputError (one line) when it cannot write."""
    problems: list[str] = []
    write_atomic(out, lambda f: _perfetto_to(s, f, problems))
    return problems


def _perfetto_to(s: Summary, f: Any, problems: list[str]) -> None:
    pids: dict[tuple[str, int], int] = {}
    f.write('{"displayTimeUnit":"ms","otherData":{"generator":"specdecode-tune report","recording":')
    f.write(json.dumps(s.data.path.name) + ',"t_first_epoch_s":' + json.dumps(s.data.t_first
            if math.isfinite(s.data.t_first) else None) + '},"traceEvents":[\n')
    first = True

    def emit(ev: dict[str, Any]) -> None:
        nonlocal first
        f.write(("" if first else ",\n") + json.dumps(ev, allow_nan=False, default=str))
        first = False

    for ev in perfetto_events(s):
        emit(ev)
    for trace in trace_bytes(s.data.path):
        pid = pids.setdefault((trace.trace_id, trace.rank), FIRST_TRACE_PID + len(pids))
        for ev in trace_file_events(s, pid, trace, problems):
            emit(_finite(ev))
    f.write("\n]}\n")


def _finite(ev: dict[str, Any]) -> dict[str, Any]:
    for k in ("ts", "dur"):
        v = ev.get(k)
        if isinstance(v, float) and not math.isfinite(v):
            ev.pop(k)
    return ev


def write_csv(s: Summary, out_dir: Path) -> list[Path]:
    """samples.csv (long format: t, t_rel_s, series, value; empty = not available), events.csv,
    settings.csv. `pd.read_csv("samples.csv").pivot_table(index="t", columns="series")` goes wide.
    The caller checks `out_dir` (CSV_FILES) first; a failed write raises OutputError (one line)."""
    d: RecordingData = s.data
    paths = []
    p = out_dir / "samples.csv"

    def samples(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["t", "t_rel_s", "series", "value"])
        rows = []
        for name, ser in d.series.items():
            for t, v in zip(ser.t, ser.v):
                rows.append((t, name, v))
        rows.sort(key=lambda r: r[0])
        for t, name, v in rows:
            w.writerow([repr(t), f"{t - d.t_first:.6f}", name, "" if math.isnan(v) else repr(v)])
    write_atomic(p, samples)
    paths.append(p)
    p = out_dir / "events.csv"

    def events(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["t", "t_rel_s", "kind", "data"])
        for e in d.events():
            w.writerow([repr(e.t), f"{e.t - d.t_first:.6f}", e.kind, dumps(thaw(e.data))])
    write_atomic(p, events)
    paths.append(p)
    p = out_dir / "settings.csv"
    rows_json = [r.to_json() for r in s.rows]

    def settings(f: Any) -> None:
        w = csv.writer(f)
        flat = [_flatten(r) for r in rows_json]
        cols = list(dict.fromkeys(k for r in flat for k in r))
        w.writerow(cols)
        for r in flat:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
    write_atomic(p, settings)
    paths.append(p)
    return paths


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out
