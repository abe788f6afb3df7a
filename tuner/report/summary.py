"""What a recording says, as plain data: the settings tried, their figures, the fastest one and why.

A setting is the active (steps, topk, draft tokens, placement) between two change points
(tuner.core.segments); time while the server was gone (`disconnected` .. `connected`) or a profiler
capture ran belongs to no setting (tuner.core.timeline, the A/B's own spans). The rows and their
figures are tuner.report.rows', the verdict and its reasons tuner.report.verdict's; this module
puts them together with the tuner's events, the captures and the flags, as the report's JSON.

Pure functions over RecordingData; must not import textual or read files itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner import __version__
from tuner.core import timeline as T
from tuner.core.event_text import event_text
from tuner.core.events import TUNING_PREFIX, EventKind, TuningKind
from tuner.core.records import thaw
from tuner.core.redact import redact
from tuner.core.segments import Segment, segments, setting_label
from tuner.report.acceptance_profile import collect
from tuner.report.data import RecordingData
from tuner.report.rows import SettingRow, build_rows, clean
from tuner.report.verdict import Verdict, verdict


@dataclass
class Summary:
    data: RecordingData
    segments: list[Segment]
    gaps: list[tuple[float, float, str]]
    rows: list[SettingRow]
    ranking_series: str
    verdict: Verdict | None
    flags: list[str]
    tuning: list[dict[str, Any]]
    predictions: list[dict[str, Any]]
    captures: list[dict[str, Any]]
    excluded: list[tuple[float, float, str]] = field(default_factory=list)   # capture windows
    acceptance: list[Any] = field(default_factory=list)   # acceptance_profile.SettingCounts per setting
    controller: dict[str, Any] | None = None               # report.controller: the adaptive controller checked
    remedies: list[str] = field(default_factory=list)       # report.remedies: what the server lets you change
    latency: dict[str, Any] | None = None                   # report.latency: per setting and over time

    def to_json(self) -> dict[str, Any]:
        d = self.data
        info = d.server_info()
        return clean({
            "report": {"tool": "specdecode-tune", "version": __version__},
            "recording": {"file": d.path.name, "schema_version": d.header.get("schema_version"),
                          "tool_version": d.header.get("tool_version"), "created_at": d.header.get("created_at"),
                          "closed_at": d.header.get("closed_at"), "t_first": d.t_first, "t_last": d.t_last,
                          "length_s": d.length_s, "command": d.header.get("command"),
                          "problems": d.problems},
            "server": {"backend": d.header.get("backend"), "url": d.header.get("url"),
                       "model": info.get("model"), "tp_size": info.get("tp_size"), "version": info.get("version"),
                       "launch": redact(info.get("launch") or d.header.get("launch") or {}),
                       "active_at_start": info.get("active") or d.header.get("active") or {},
                       "gpus": d.header.get("gpus") or [], "ranks": d.header.get("ranks") or []},
            "flags": self.flags,
            "ranking_series": self.ranking_series,
            "settings": [r.to_json() for r in self.rows],
            "fastest": self.verdict.to_json() if self.verdict else None,
            "gaps": [{"t0": a, "t1": b, "error": e} for a, b, e in self.gaps],
            "capture_windows": [{"t0": a, "t1": b, "trace_id": i} for a, b, i in self.excluded],
            "changes": [{"t": s.t0, "setting": setting_label(s.key), "source": s.source} for s in self.segments],
            "captures": self.captures,
            "tuning": self.tuning,
            "predictions": self.predictions,
            "acceptance_by_bucket": [c.to_json() for c in self.acceptance],
            "adaptive_controller": self.controller,
            "remedies": self.remedies,
            "latency": self.latency,
        })




def segments_of(data: RecordingData, cuts: list[tuple[float, float, str]]) -> list[Segment]:
    """The recording's segments (tuner.core.segments.segments) from the setting its header says
    ran at the start."""
    start = data.header.get("active") or (data.header.get("server_info") or {}).get("active") or {}
    return segments(data, start, cuts)


# -- events worth a table -----------------------------------------------------------------------------

def tuning_of(data: RecordingData) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(tuning events as rows, the last prediction table) when the recording has a tuner's run."""
    rows, preds = [], []
    for e in data.events():
        if not e.kind.startswith(TUNING_PREFIX):
            continue
        d = thaw(e.data)
        said = event_text(e.kind, d)
        rows.append({"t": e.t, "kind": e.kind, "summary": said.text if said is not None else ""})
        if e.kind == TuningKind.PREDICTION:
            preds = list(d.get("predictions") or [])
    return rows, preds


def captures_of(data: RecordingData) -> list[dict[str, Any]]:
    """One entry per capture: time, ranks, mode, rank-0 mean per phase and the cross-rank skew."""
    out = []
    by_id: dict[str, list] = {}
    for tr in data.traces():
        by_id.setdefault(tr.trace_id, []).append(tr)
    for tid, files in by_id.items():
        analysis = next((f.analysis for f in files if f.analysis), None)
        entry: dict[str, Any] = {"trace_id": tid, "t": files[0].t, "ranks": len(files),
                                 "bytes": sum(f.size for f in files), "mode": None, "phases": {},
                                 "wall_ms": None, "idle_ms": None, "iterations": None, "skew_ms": None,
                                 "slowest_rank": None, "warnings": []}
        if analysis:
            entry["mode"] = analysis.get("mode")
            entry["warnings"] = list(analysis.get("warnings") or [])
            ranks = analysis.get("ranks") or []
            if ranks:
                r0 = ranks[0]
                mean = r0.get("mean") or {}
                entry["wall_ms"], entry["idle_ms"] = mean.get("wall_ms"), mean.get("idle_ms")
                entry["iterations"] = len(r0.get("iterations") or [])
                entry["phases"] = {p: {"ms": v.get("ms"), "comm_ms": v.get("comm_ms"), "span_ms": v.get("span_ms")}
                                   for p, v in (mean.get("phases") or {}).items()}
            across = analysis.get("across") or {}
            entry["skew_ms"], entry["slowest_rank"] = across.get("skew_ms"), across.get("slowest_rank")
        else:
            ev = next((e for e in data.events(EventKind.TRACE_CAPTURED) if e.data.get("trace_id") == tid), None)
            if ev is not None and ev.data.get("analysis_error"):
                entry["warnings"] = [str(ev.data.get("analysis_error"))]
        out.append(entry)
    return out


def flags_of(data: RecordingData) -> list[str]:
    """Emulation and simulation stated by the server, said loudly."""
    info = data.server_info()
    launch = info.get("launch") or {}
    flags = []
    emu = launch.get("emulate_comm_latency")
    if emu or info.get("emulated_comm"):
        flags.append(f"EMULATED slow link: every collective was delayed by the engine "
                     f"(--emulate-comm-latency {emu or '?'}); comm times are emulation, not hardware")
    sim = launch.get("speculative_simulate_accept")
    how = (f"--speculative-simulate-accept {sim}" if sim else "--speculative-simulate-accept-profile"
           if launch.get("speculative_simulate_accept_profile") else "--speculative-simulate-accept ?")
    if sim or info.get("simulated_accept") or launch.get("speculative_simulate_accept_profile"):
        flags.append(f"SIMULATED acceptance ({how}): accept lengths "
                     "come from the simulator, not from the draft model")
    if data.header.get("backend") == "replay":
        flags.append("recorded from a replay, not a live server")
    return flags


def summarize(data: RecordingData) -> Summary:
    """The report of one recording: its segments (tuner.core.segments, cut where the server was away,
    a capture ran or the load started or stopped: tuner.core.timeline), rows, verdict and tables."""
    gaps = T.gaps(data, data.t_last)
    windows = T.captures(data)
    segments = segments_of(data, gaps + windows + T.load_cuts(data))
    rows, ranking = build_rows(data, segments)
    tuning, preds = tuning_of(data)
    from tuner.report.controller import controller_of
    from tuner.report.latency import latency_of
    from tuner.report.remedies import remedies_of
    return Summary(data, segments, gaps, rows, ranking, verdict(rows), flags_of(data), tuning, preds,
                   captures_of(data), windows, collect(data, segments), controller_of(data), remedies_of(data),
                   latency_of(data, segments))
