"""What a recording says, as plain data: the settings tried, their figures, the fastest one and why.

A setting is the active (steps, topk, draft tokens, placement) between two change points
(`config_changed`, or a `server_info` whose active setting differs after a relaunch); time while the
server was gone (`disconnected` .. `connected`) or a profiler capture ran belongs to no setting.
Figures follow ARCHITECTURE "What better means" through tuner.core.windows, the rule the TUI's A/B
and the tuner use: after each change (and each load start/stop, reconnect or capture) drop the
settling, cut the rest into 1-s windows and take the median of the window means for tok/s
(client-side tokens when the load driver ran in every setting, else the server's decode rate).
Phase times are the mean per-iteration readings (inclusive), their collective parts alongside,
never added to them. "Why" decomposes tok/s = B * tau / T into batch, accept length and iteration
time, and names the phases that moved.

Pure functions over RecordingData; must not import textual or read files itself.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from tuner import __version__
from tuner.core import series as S
from tuner.core import setting as vocab
from tuner.core import windows as W
from tuner.core import timeline as T
from tuner.core.event_text import event_text
from tuner.core.redact import redact
from tuner.core.windows import MIN_WINDOWS
from tuner.core.records import thaw
from tuner.report.data import RecordingData

TUNING_PREFIX = "tuning_"


def setting_key(active: Any) -> tuple:
    """The report's columns: each table knob's active value (server-arg names), in table order."""
    return tuple((active or {}).get(k) for k in vocab.args())


def setting_label(key: tuple) -> str:
    """`steps=3 topk=1 draft_tokens=4 placement=sharded` for a `setting_key`."""
    return vocab.pairs(dict(zip(vocab.args(), key))) or "unknown setting"


@dataclass
class Segment:
    key: tuple
    t0: float
    t1: float
    source: str               # what started it: "start", "config_changed", "server_info", "connected"


@dataclass
class SettingRow:
    """One setting tried, over all the time it was active."""

    key: tuple
    label: str
    order: int                              # first time tried: 0, 1, ...
    seconds: float = 0.0                    # active time, gaps excluded
    settled_s: float = 0.0                  # the part the figures come from
    windows: list[float] = field(default_factory=list)        # 1-s means of the ranking series
    tok_s: float = math.nan                 # median of `windows`
    server_tok_s: float = math.nan
    client_tok_s: float = math.nan
    accept_len: float = math.nan
    accept_rate: float = math.nan
    accept_pos: dict[int, float] = field(default_factory=dict)
    batch: float = math.nan
    iter_per_s: float = math.nan
    phase_ms: dict[str, float] = field(default_factory=dict)
    comm_ms: dict[str, float] = field(default_factory=dict)
    wall_ms: float = math.nan
    idle_ms: float = math.nan
    gpus: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per GPU index, the mean NVML reading of each GPU_METRICS series over the setting's time."""

    def comm_share(self, phase: str) -> float:
        ms, comm = self.phase_ms.get(phase, math.nan), self.comm_ms.get(phase, math.nan)
        return comm / ms if ms and ms > 0 and not math.isnan(comm) else math.nan

    def to_json(self) -> dict[str, Any]:
        return _clean({
            "setting": dict(zip(vocab.args(), self.key)), "label": self.label, "seconds": self.seconds,
            "settled_s": self.settled_s, "windows": len(self.windows), "tok_per_s_median": self.tok_s,
            "server_tok_per_s": self.server_tok_s, "client_tok_per_s": self.client_tok_s,
            "accept_len": self.accept_len, "accept_rate": self.accept_rate,
            "accept_pos": {str(k): v for k, v in sorted(self.accept_pos.items())},
            "batch_size": self.batch, "iter_per_s": self.iter_per_s,
            "phase_ms": self.phase_ms, "phase_comm_ms": self.comm_ms, "wall_ms": self.wall_ms,
            "idle_ms": self.idle_ms,
            "comm_share": {"draft": self.comm_share("draft"), "verify": self.comm_share("verify")},
            "gpus": {str(i): m for i, m in sorted(self.gpus.items())},
        })


# NVML series summarised per setting (what moves when the draft's placement or steps change).
GPU_METRICS = ("sm_active_pct", "util_pct", "power_w", "mem_used_mib", "nvlink_rx_mbps", "nvlink_tx_mbps",
               "pcie_rx_mbps", "pcie_tx_mbps")
GPU_TABLE_HEAD = ["setting", "GPU", "SM active %", "util %", "power W", "memory GiB", "NVLink rx / tx MB/s",
                  "PCIe rx / tx MB/s"]


@dataclass
class Verdict:
    """The fastest setting and the reasons, against the runner-up (and the first setting)."""

    best: SettingRow
    other: SettingRow | None
    ratio: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    sentences: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return _clean({"best": self.best.label, "against": self.other.label if self.other else None,
                       "ratio": self.ratio, "ci95": [self.lo, self.hi], "why": self.sentences})


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

    def to_json(self) -> dict[str, Any]:
        d = self.data
        info = d.server_info()
        return _clean({
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
        })


def _clean(x: Any) -> Any:
    """JSON-ready: NaN/inf -> None, tuples -> lists, keys -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


# -- timeline -------------------------------------------------------------------------------------------

def segments_of(data: RecordingData, gaps: list[tuple[float, float, str]]) -> list[Segment]:
    """The active setting over time, cut at every change point and around every excluded time
    (server gone, profiler capture running); a zero-length gap only cuts."""
    start_active = data.header.get("active") or (data.header.get("server_info") or {}).get("active") or {}
    points: list[tuple[float, tuple, str]] = []
    for e in data.events(("config_changed", "server_info")):
        active = e.data.get("new") if e.kind == "config_changed" else e.data.get("active")
        if active:
            points.append((e.t, setting_key(thaw(active)), e.kind))
    key = setting_key(start_active)
    if points and points[0][2] == "server_info" and points[0][0] <= data.t_first + 5:
        key = points[0][1]
    if not math.isfinite(data.t_first):
        return []
    cuts: list[tuple[float, tuple, str]] = [(data.t_first, key, "start")]
    for t, k, src in points:
        if k != cuts[-1][1]:
            cuts.append((max(t, data.t_first), k, src))
    # Gaps remove time; what runs after a gap is whatever was active before it unless a change says.
    segs: list[Segment] = []
    for i, (t0, k, src) in enumerate(cuts):
        t1 = cuts[i + 1][0] if i + 1 < len(cuts) else data.t_last
        pieces = [(t0, t1)]
        for g0, g1, _ in gaps:
            nxt = []
            for a, b in pieces:
                if g1 <= a or g0 >= b or (g0 == g1 == a):
                    nxt.append((a, b))
                    continue
                if a < g0:
                    nxt.append((a, g0))
                if g1 < b:
                    nxt.append((g1, b))
            pieces = nxt
        for j, (a, b) in enumerate(pieces):
            if b > a:
                segs.append(Segment(k, a, b, src if j == 0 and a == t0 else "resumed"))
    return segs


# -- figures --------------------------------------------------------------------------------------------

def settle_start(data: RecordingData, t0: float, t1: float) -> float:
    """When the readings of a segment [t0, t1] start to count (tuner.core.timeline.settle_end); t1
    when it never settles."""
    return min(T.settle_end(data, t0, until=t1), t1)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def build_rows(data: RecordingData, segments: list[Segment]) -> tuple[list[SettingRow], str]:
    """One row per distinct setting, in the order first tried; and the series tok/s is ranked by."""
    spans: dict[tuple, list[tuple[float, float, float]]] = {}   # key -> [(t0, settled, t1)]
    order: list[tuple] = []
    for seg in segments:
        if seg.key not in spans:
            spans[seg.key] = []
            order.append(seg.key)
        spans[seg.key].append((seg.t0, settle_start(data, seg.t0, seg.t1), seg.t1))

    def gather(name: str, key: tuple, windows: bool = False) -> list[float]:
        s = data.get(name)
        out: list[float] = []
        for _, a, b in spans[key]:
            out += T.window_means(data, name, a, b) if windows else s.finite_between(a, b)
        return out

    client_everywhere = all(gather(S.LOAD_TOK_PER_S, k, True) for k in order) and bool(order)
    ranking = S.LOAD_TOK_PER_S if client_everywhere else S.SERVER_TOK_PER_S
    rows = []
    for i, key in enumerate(order):
        r = SettingRow(key, setting_label(key), i)
        r.seconds = sum(b - a for a, _, b in spans[key])
        r.settled_s = sum(b - s for _, s, b in spans[key])
        r.windows = gather(ranking, key, True)
        r.tok_s = _median(r.windows)
        r.server_tok_s = _median(gather(S.SERVER_TOK_PER_S, key, True))
        r.client_tok_s = _median(gather(S.LOAD_TOK_PER_S, key, True))
        r.accept_len = _mean(gather(S.SPEC_ACCEPT_LEN, key))
        r.accept_rate = _mean(gather(S.SPEC_ACCEPT_RATE, key))
        steps = key[0] if isinstance(key[0], int) else None
        for name in data.names("spec/accept_pos/"):
            k = int(name.rsplit("/", 1)[1]) if name.rsplit("/", 1)[1].isdigit() else None
            if k is None or (steps is not None and k > steps):
                continue
            v = _mean(gather(name, key))
            if not math.isnan(v):
                r.accept_pos[k] = v
        r.batch = _mean(gather(S.SERVER_BATCH, key))
        r.iter_per_s = _mean(gather(S.SERVER_ITER_PER_S, key))
        for p in S.PHASES:
            ms = _mean(gather(S.phase_ms(p), key))
            if not math.isnan(ms):
                r.phase_ms[p] = ms
                r.comm_ms[p] = _mean(gather(S.phase_comm_ms(p), key))
        r.wall_ms = _mean(gather(S.PHASE_WALL_MS, key))
        r.idle_ms = _mean(gather(S.PHASE_IDLE_MS, key))
        for gpu in gpu_indices(data):
            vals = {m: _mean(gather(S.gpu(gpu, m), key)) for m in GPU_METRICS}
            if any(not math.isnan(v) for v in vals.values()):
                r.gpus[gpu] = vals
        rows.append(r)
    return rows, ranking


def gpu_table_rows(rows: list[SettingRow]) -> list[list[str]]:
    """One row per (setting, GPU) with NVML readings: the cells of GPU_TABLE_HEAD."""
    def n(x: float, fmt: str) -> str:
        return "n/a" if x is None or math.isnan(x) else fmt.format(x)

    out = []
    for r in rows:
        for gpu, m in sorted(r.gpus.items()):
            out.append([r.label, str(gpu), n(m["sm_active_pct"], "{:.1f}"), n(m["util_pct"], "{:.0f}"),
                        n(m["power_w"], "{:.0f}"), n(m["mem_used_mib"] / 1024, "{:.1f}"),
                        f"{n(m['nvlink_rx_mbps'], '{:.0f}')} / {n(m['nvlink_tx_mbps'], '{:.0f}')}",
                        f"{n(m['pcie_rx_mbps'], '{:.0f}')} / {n(m['pcie_tx_mbps'], '{:.0f}')}"])
    return out


def gpu_indices(data: RecordingData) -> list[int]:
    """The GPU indices the recording has NVML series for (`gpu<i>/...`)."""
    out = set()
    for name in data.names("gpu"):
        head = name.split("/", 1)[0]
        if head[3:].isdigit():
            out.add(int(head[3:]))
    return sorted(out)


# -- the verdict ----------------------------------------------------------------------------------------

def verdict(rows: list[SettingRow]) -> Verdict | None:
    """The fastest setting with enough windows, compared with the runner-up, in sentences."""
    measured = [r for r in rows if not math.isnan(r.tok_s)]
    if not measured:
        return None
    enough = [r for r in measured if len(r.windows) >= MIN_WINDOWS] or measured
    ranked = sorted(enough, key=lambda r: r.tok_s, reverse=True)
    best, other = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    v = Verdict(best, other)
    if other is None:
        short = [r for r in rows if r is not best]
        if not short:
            v.sentences.append(f"Only one setting ran ({best.label}: {best.tok_s:.1f} tok/s); "
                               "change a setting while recording to compare.")
            return v
        # Others ran, but their readings were cut short (a capture, the server away, the settling
        # after a change): say how short, and what a comparison needs.
        said = "; ".join(f"{r.label} ran {r.seconds:.0f} s with {len(r.windows)} settled 1-s window"
                         f"{'' if len(r.windows) == 1 else 's'}" for r in sorted(short, key=lambda r: r.order))
        v.sentences.append(f"Only {best.label} has enough settled readings ({best.tok_s:.1f} tok/s, "
                           f"{len(best.windows)} windows); {said}. A comparison needs {MIN_WINDOWS} on each "
                           "side: run each setting longer (captures and server gaps are left out).")
        return v
    v.ratio, v.lo, v.hi = compare(other, best)
    pct = (v.ratio - 1) * 100
    s = (f"{best.label} is the fastest: {best.tok_s:.1f} tok/s, {pct:+.1f} % over {other.label} "
         f"({other.tok_s:.1f} tok/s)")
    if W.enough(other.windows, best.windows) and not math.isnan(v.lo):
        s += f", 95 % interval [{(v.lo - 1) * 100:+.1f}, {(v.hi - 1) * 100:+.1f}] %"
        if W.judge(v.lo, v.hi) == W.WITHIN_NOISE:
            s += " — within noise"
    else:
        s += f" (fewer than {MIN_WINDOWS} settled 1-s windows on a side: tentative)"
    v.sentences.append(s + ".")
    v.sentences += why(best, other)
    return v


def compare(other: SettingRow, best: SettingRow) -> tuple[float, float, float]:
    """best's tok/s over other's, with its 95 % interval. The bootstrap always runs in the order the
    settings were tried (the earlier one is "before", as in the TUI's A/B after that change), and
    the answer is turned round when the earlier one is the faster: the same windows give the same
    interval whichever way round they are asked."""
    if other.order <= best.order:
        return W.ratio_of_medians(other.windows, best.windows)
    ratio, lo, hi = W.ratio_of_medians(best.windows, other.windows)
    return 1 / ratio if ratio else math.nan, 1 / hi if hi else math.nan, 1 / lo if lo else math.nan


def why(best: SettingRow, other: SettingRow) -> list[str]:
    """tok/s = B * tau / T: which of batch, accept length and iteration time made the difference,
    and which phases moved T (with their collective parts, reported beside, never summed in)."""
    out = []
    tau_b, tau_o = best.accept_len, other.accept_len
    t_b, t_o = best.wall_ms, other.wall_ms
    if not (math.isnan(tau_b) or math.isnan(tau_o) or math.isnan(t_b) or math.isnan(t_o)) and t_b > 0 and tau_o > 0:
        tau_r, t_r = tau_b / tau_o, t_o / t_b
        b_r = best.batch / other.batch if best.batch and other.batch and not math.isnan(best.batch / other.batch) else 1.0
        parts = [f"accept length {tau_o:.2f} → {tau_b:.2f} ({(tau_r - 1) * 100:+.1f} %)",
                 f"iteration time {t_o:.2f} → {t_b:.2f} ms ({(t_b / t_o - 1) * 100:+.1f} %)"]
        if abs(b_r - 1) > 0.05:
            parts.append(f"batch {other.batch:.2f} → {best.batch:.2f}")
        same = 0.02            # changes this small are noise, not a reason
        lead = "more tokens per iteration" if math.log(tau_r) > math.log(t_r) else "shorter iterations"
        if abs(tau_r - 1) < same and t_r > 1:
            lead = "shorter iterations at about the same accept length"
        elif abs(t_r - 1) < same and tau_r > 1:
            lead = "more tokens per iteration at about the same iteration time"
        elif tau_r < 1 and t_r > 1:
            lead = "shorter iterations, despite fewer tokens accepted per iteration"
        elif tau_r > 1 and t_r < 1:
            lead = "more tokens per iteration, despite longer iterations"
        out.append(f"Why (tok/s = batch × accept length ÷ iteration time): {lead} — " + "; ".join(parts) + ".")
    deltas = []
    for p in S.PHASES:
        if p in best.phase_ms and p in other.phase_ms:
            deltas.append((best.phase_ms[p] - other.phase_ms[p], p))
    deltas.sort(key=lambda d: -abs(d[0]))
    moved = []
    for d, p in deltas[:3]:
        if abs(d) < 0.01:
            continue
        cb, co = best.comm_ms.get(p, math.nan), other.comm_ms.get(p, math.nan)
        comm = (f", of which collectives {cb - co:+.2f} ms ({co:.2f} → {cb:.2f})"
                if not (math.isnan(cb) or math.isnan(co)) and abs(cb - co) >= 0.01 else "")
        moved.append(f"{p} {other.phase_ms[p]:.2f} → {best.phase_ms[p]:.2f} ms ({d:+.2f}{comm})")
    if moved:
        out.append("Phase split per iteration (rank 0, inclusive times): " + "; ".join(moved) + ".")
    return out


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
        if e.kind == "tuning_prediction":
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
            ev = next((e for e in data.events("trace_captured") if e.data.get("trace_id") == tid), None)
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
    gaps = T.gaps(data, data.t_last)
    windows = T.captures(data)
    segments = segments_of(data, gaps + windows + T.load_cuts(data))
    rows, ranking = build_rows(data, segments)
    tuning, preds = tuning_of(data)
    from tuner.report.acceptance_profile import collect
    from tuner.report.controller import controller_of
    from tuner.report.remedies import remedies_of
    return Summary(data, segments, gaps, rows, ranking, verdict(rows), flags_of(data), tuning, preds,
                   captures_of(data), windows, collect(data, segments), controller_of(data), remedies_of(data))
