"""The report's rows: one per setting tried, with its figures over the settled part of its segments.

Figures follow "what better means" (docs/ARCHITECTURE.md, "One measurement path") through
tuner.core.timeline and tuner.core.windows, the rule the TUI's A/B and the tuner use: each segment
(tuner.core.segments) drops its settling, the rest is cut into 1-s windows and tok/s is the median of the window means (client-side tokens when
the load driver ran in every setting, else the server's decode rate). Phase times are the mean
per-iteration readings (inclusive), their collective parts alongside, never added to them; NVML
readings are averaged per GPU.

Pure functions over RecordingData; must not import textual, read files or word a verdict.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from probes.names import R_PHASE_MS
from tuner.core import series as S
from tuner.core import setting as vocab
from tuner.core import timeline as T
from tuner.core.segments import Segment, setting_label
from tuner.report.data import RecordingData


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
        return clean({
            "setting": dict(zip(vocab.args(), self.key)), "label": self.label, "seconds": self.seconds,
            "settled_s": self.settled_s, "windows": len(self.windows), "tok_per_s_median": self.tok_s,
            "server_tok_per_s": self.server_tok_s, "client_tok_per_s": self.client_tok_s,
            "accept_len": self.accept_len, "accept_rate": self.accept_rate,
            "accept_pos": {str(k): v for k, v in sorted(self.accept_pos.items())},
            "batch_size": self.batch, "iter_per_s": self.iter_per_s,
            R_PHASE_MS: self.phase_ms, "phase_comm_ms": self.comm_ms, "wall_ms": self.wall_ms,
            "idle_ms": self.idle_ms,
            "comm_share": {"draft": self.comm_share("draft"), "verify": self.comm_share("verify")},
            "gpus": {str(i): m for i, m in sorted(self.gpus.items())},
        })


# NVML series summarised per setting (what moves when the draft's placement or steps change).
GPU_METRICS = ("sm_active_pct", "util_pct", "power_w", "mem_used_mib", "nvlink_rx_mbps", "nvlink_tx_mbps",
               "pcie_rx_mbps", "pcie_tx_mbps")
GPU_TABLE_HEAD = ["setting", "GPU", "SM active %", "util %", "power W", "memory GiB", "NVLink rx / tx MB/s",
                  "PCIe rx / tx MB/s"]


def clean(x: Any) -> Any:
    """JSON-ready: NaN/inf -> None, tuples -> lists, keys -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


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
        # Readings count once the segment has settled (the segment's end when it never does).
        spans[seg.key].append((seg.t0, min(T.settle_end(data, seg.t0, until=seg.t1), seg.t1), seg.t1))

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
