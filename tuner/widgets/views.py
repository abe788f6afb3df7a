"""What each panel draws, pulled from the store: window queries in, plain view dataclasses out.

These functions are the only place the TUI reads the store. They pick windows and turn readings
and events into the numbers and words a panel shows; they must not compute new measurements (means
over a shown window are presentation, the A/B statistics are the core's).
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any, Iterable, Mapping

from probes import accept_buckets as AB
from tuner.core import latency as L
from tuner.core import series as S
from tuner.core import setting as vocab
from tuner.core.event_text import event_text
from tuner.core.events import EventKind, TuningKind
from tuner.core.records import Event, thaw
from tuner.core.store import Store
from tuner.tuning import controller_check as CC
from tuner.tuning.what_if_now import WhatIfReadout, what_if_now
from tuner.widgets.acceptance import AcceptView
from tuner.widgets.charts import ACCEPT_COLOR, CLIENT_COLOR, LOG_COLOR, SERVER_COLOR, ChartView, Series
from tuner.widgets.event_log import LogLine
from tuner.widgets.fmt import is_num
from tuner.widgets.gpus import GpuRow, GpuView
from tuner.widgets.latency import LatencyRow, LatencyView
from tuner.widgets.phases import PhaseView

NAN = math.nan

def mean(values: Iterable[float]) -> float:
    vals = [v for v in values if is_num(v)]
    return sum(vals) / len(vals) if vals else NAN


def setting_text(active: Mapping[str, Any]) -> str:
    """`steps 3 · topk 1 · draft 4 · sharded` from an active-config dict (either naming)."""
    return vocab.words(active)


def change_label(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The short words for a change, e.g. `steps 3→5` or `placement sharded→rank0`."""
    return vocab.change_words(old, new)


SMOOTH_S = 2.0
"""Charts draw a trailing mean over this many seconds: per-poll rates of a busy server jump between
0 and twice the mean, which hides the change a person is looking for."""


def trailing_mean(t: tuple[float, ...], v: tuple[float, ...], span: float) -> tuple[float, ...]:
    """Mean of the available values in (t_i - span, t_i] at every t_i; NaN where there are none."""
    out, lo, acc, n = [], 0, 0.0, 0
    for i, (ti, vi) in enumerate(zip(t, v)):
        if is_num(vi):
            acc, n = acc + vi, n + 1
        while t[lo] <= ti - span:
            if is_num(v[lo]):
                acc, n = acc - v[lo], n - 1
            lo += 1
        out.append(acc / n if n else NAN)
    return tuple(out)


def _chart_series(store: Store, name: str, label: str, color: tuple[int, int, int], origin: float,
                  t0: float, t1: float) -> Series | None:
    w = store.window(name, t0 - SMOOTH_S, t1)
    if not len(w):
        return None
    return Series(label, tuple(t - origin for t in w.t), trailing_mean(w.t, w.v, SMOOTH_S), color)


def throughput_view(store: Store, origin: float, t_end: float, window_s: float) -> ChartView:
    t0 = t_end - window_s
    # "log": the decode lines' own tok/s, under `launch` (SGLang's log-window figure).
    out = [s for name, label, color in ((S.SERVER_TOK_PER_S, "server", SERVER_COLOR),
                                        (S.LOAD_TOK_PER_S, "client", CLIENT_COLOR),
                                        (S.LOG_GEN_THROUGHPUT, "log", LOG_COLOR))
           if (s := _chart_series(store, name, label, color, origin, t0, t_end)) is not None]
    return ChartView(tuple(out), _markers(store, origin, t0, t_end), t_end - origin, window_s)


def accept_chart_view(store: Store, origin: float, t_end: float, window_s: float) -> ChartView:
    t0 = t_end - window_s
    s = _chart_series(store, S.SPEC_ACCEPT_LEN, "τ", ACCEPT_COLOR, origin, t0, t_end)
    return ChartView((s,) if s else (), _markers(store, origin, t0, t_end, short=True), t_end - origin, window_s)


def _markers(store: Store, origin: float, t0: float, t1: float, short: bool = False
             ) -> tuple[tuple[float, str], ...]:
    out = []
    for e in store.events(EventKind.CONFIG_CHANGED, t0, t1):
        label = "" if short else change_label(e.data.get("old") or {}, e.data.get("new") or {})
        out.append((e.t - origin, label))
    return tuple(out)


def accept_view(store: Store, t_end: float, steps: int | None, window_s: float = 10.0) -> AcceptView:
    """τ and p_k as means over the last `window_s` (a single poll often saw no verify: NaN)."""
    n = steps if steps is not None else _max_position(store)
    t0 = t_end - window_s
    positions = tuple(mean(store.window(S.accept_pos(k), t0, t_end).v) for k in range(1, n + 1))
    if positions and not any(is_num(p) for p in positions):
        positions = ()
    return AcceptView(mean(store.window(S.SPEC_ACCEPT_LEN, t0, t_end).v), positions, steps,
                      bucket_rows(store, t0, t_end, n), controller_lines(store, t_end))


def controller_lines(store: Store, t_end: float) -> tuple[str, ...]:
    """The newest controller check (tuner.tuning.controller_watch's event) as a title and one line
    per batch bucket; () when the server runs no adaptive controller."""
    e = store.last_event(CC.EVENT_KIND, at=t_end)
    if e is None:
        return ()
    doc = thaw(e.data)
    title = "adaptive controller vs tuned" + (" (approximate)" if doc.get("approximate") else "")
    cost = CC.overall_text(doc)
    return (title + (f": {cost}" if cost else ""), *CC.lines(doc))


def _by_time(w: Any) -> dict[float, float]:
    return dict(zip(w.t, w.v))


def bucket_rows(store: Store, t0: float, t_end: float, steps: int) -> tuple[tuple[str, int, tuple[float, ...]], ...]:
    """Per batch-size / context bucket over the window: (range, verify rounds, p_1..p_steps), from
    the counts each page's readings give back (probes.accept_buckets), not a mean of rates."""
    if steps <= 0:
        return ()
    out = []
    names = {n.split("/")[1] for n in store.series_names("spec/") if n.endswith("/verifies") and n.count("/") == 2}
    for name in sorted((n for n in names if AB.parse_bucket(n)), key=AB.sort_key):
        w = store.window(S.bucket_verifies(name), t0, t_end)
        pos = [_by_time(store.window(S.bucket_accept_pos(name, k), t0, t_end)) for k in range(1, steps + 1)]
        h: list[int] = []
        for t, v in zip(w.t, w.v):
            got = AB.histogram_from_positions(v, [p.get(t, NAN) for p in pos])
            if got is not None:
                h = AB.add(h, got)
        if sum(h):
            acc = AB.position_acceptance(h, steps)
            out.append((AB.bucket_range(name), acc.verifies, acc.p))
    return tuple(out)


def _max_position(store: Store) -> int:
    ks = [int(m.group(1)) for n in store.series_names("spec/accept_pos/")
          if (m := re.fullmatch(r"spec/accept_pos/(\d+)", n))]
    return max(ks, default=0)


def phase_view(store: Store, t_end: float, window_s: float, unavailable: str = "") -> PhaseView:
    t0 = t_end - window_s
    phase = {p: mean(store.window(S.phase_ms(p), t0, t_end).v) for p in S.PHASES}
    comm = {p: mean(store.window(S.phase_comm_ms(p), t0, t_end).v) for p in S.PHASES}
    wall = mean(store.window(S.PHASE_WALL_MS, t0, t_end).v)
    iters = store.window(S.SERVER_ITERATIONS, t0, t_end).finite()
    count = int(iters[-1] - iters[0]) if len(iters) >= 2 else (0 if not is_num(wall) else 1)
    if not is_num(wall) and not any(is_num(v) for v in phase.values()):
        count = 0
    return PhaseView(phase, comm, wall, count, window_s, unavailable)


def what_if_view(store: Store, t_end: float, active: Mapping[str, Any], tp_size: Any,
                 window_s: float, has_phases: bool = True, device: Any = None, kind: Any = None) -> WhatIfReadout:
    """The draft-off-the-TP-group readout (computed by tuner.tuning.what_if_now, not here)."""
    return what_if_now(store, t_end, active, tp_size if isinstance(tp_size, int) else None, window_s,
                       has_phases, device if isinstance(device, str) else None, kind if isinstance(kind, str) else None)


LATENCY_KINDS = (EventKind.LOAD_REQUEST, EventKind.LATENCY_BUCKETS, EventKind.LATENCY_UNAVAILABLE)
NO_RATE = "closed-loop load: TTFT and queue time barely move; --rate R (Poisson arrivals) opens the loop"
NO_LOAD = "no load from here: the figures are the server's buckets (l, or --rate R, starts one)"


def latency_view(store: Store, t_end: float, window_s: float) -> LatencyView | None:
    """The last `window_s` of latency (tuner.core.latency.window_readout: the load driver's exact
    percentiles, the server's histogram buckets); None while the session has no latency event at
    all (the panel stays hidden, e.g. on a recording made before latency was recorded)."""
    if store.last_event(LATENCY_KINDS, at=t_end) is None:
        return None
    t0 = t_end - window_s
    events = [*store.events(LATENCY_KINDS[:2], t0, t_end),
              *store.events(EventKind.LATENCY_UNAVAILABLE, t1=t_end)[-1:]]
    r = L.window_readout(events, t0, t_end)
    drv, srv = r["driver"], r["server"]
    rows = []
    for kind in L.KINDS:
        d, b = drv.get(kind) or {}, (srv.get(kind) or {}).get("p99")
        if d or b:
            server = (f"≤ {L.ms_text(b[1])}" if b[1] is not None else f"> {L.ms_text(b[0])}") if b else ""
            rows.append(LatencyRow(L.LABELS[kind], d.get("p50", NAN), d.get("p90", NAN), d.get("p99", NAN), server))
    notes = []
    if r["unavailable"]:
        notes.append(str(r["unavailable"]))
    started = store.last_event(EventKind.LOAD_STARTED, at=t_end)
    stopped = store.last_event(EventKind.LOAD_STOPPED, at=t_end)
    if started is None or (stopped is not None and stopped.t >= started.t):
        notes.append(NO_LOAD)
    elif started.data.get("rate") is None:
        notes.append(NO_RATE)
    return LatencyView(tuple(rows), window_s, int(r["requests"]), tuple(notes))


class LatencyABCache:
    """The A/B's latency row (tuner.core.latency_ab, p99 ITL): the sides are read from the store here,
    on the TUI's thread; the bootstrap (1-2 s) runs on a thread of its own at most once per change
    and REFRESH_S, and `get` answers the newest finished verdict for the change now (None before)."""

    REFRESH_S = 10.0

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._done: tuple[float, Any] | None = None        # (the change's time, LatencyAB)
        self._busy = threading.Event()

    def get(self, store: Store, now: float) -> Any:
        from tuner.core import latency_ab as LAB
        change = store.last_event(EventKind.CONFIG_CHANGED, at=now)
        if change is None:
            return None
        key = (change.t, math.floor(now / self.REFRESH_S))
        if key != self._key and not self._busy.is_set():
            self._key = key
            got = LAB.sides(store, now)
            if isinstance(got, LAB.LatencyAB):
                self._done = (change.t, got)
            else:
                self._busy.set()
                threading.Thread(target=self._judge, args=(change.t, got), name="tui-latency-ab", daemon=True).start()
        done = self._done
        return done[1] if done is not None and done[0] == change.t else None

    def _judge(self, change_t: float, got: tuple) -> None:
        from tuner.core import latency_ab as LAB
        try:
            self._done = (change_t, LAB.judge(*got))
        finally:
            self._busy.clear()


# NVML sampler names (probes/gpu_readings.py SERIES) tried in order for each column: the first with
# a reading wins (SM activity needs GPM, Hopper and later; older GPUs fall back to utilisation).
GPU_METRICS: dict[str, tuple[str, ...]] = {
    "sm_pct": ("sm_active_pct", "util_pct"),
    "mem_used": ("mem_used_mib",),
    "mem_total": ("mem_total_mib",),
    "power_w": ("power_w",),
    "power_limit_w": ("power_limit_w",),
    "pcie_rx": ("pcie_rx_mbps",),
    "pcie_tx": ("pcie_tx_mbps",),
    "nvlink_rx": ("nvlink_rx_mbps",),
    "nvlink_tx": ("nvlink_tx_mbps",),
}
# To the units the GPU table shows: bytes and bytes per second.
_TO_BYTES = {"_mib": 2.0**20, "_mbps": 1e6}


def _scale(name: str) -> float:
    return next((k for unit, k in _TO_BYTES.items() if name.endswith(unit)), 1.0)


def gpu_indices(store: Store) -> list[int]:
    found = {int(m.group(1)) for n in store.series_names("gpu")
             if (m := re.match(r"gpu(\d+)/", n))}
    return sorted(found)


def gpu_view(store: Store, t_end: float, history_s: float = 30.0, note: str = "",
             labels: Mapping[int, str] | None = None) -> GpuView:
    rows = []
    for i in gpu_indices(store):
        values: dict[str, Any] = {}
        for col, candidates in GPU_METRICS.items():
            value, used = NAN, None
            for c in candidates:
                v = store.value(S.gpu(i, c), t_end)
                if is_num(v):
                    value, used = v * _scale(c), S.gpu(i, c)
                    break
            values[col] = value
            if col == "sm_pct" and used is not None:
                values["sm_history"] = store.window(used, t_end - history_s, t_end).v
        rows.append(GpuRow(index=i, name=(labels or {}).get(i, ""), **values))
    return GpuView(tuple(rows), note)


LOG_HIDDEN = frozenset({TuningKind.PROBE, TuningKind.PREDICTION})
"""Event kinds the log leaves out: the tuner's probes and predictions are the tune screen's rows."""


def event_line(e: Event, origin: float) -> LogLine | None:
    """One log line for an event (tuner.core.event_text's words), or None for kinds the log does not show."""
    if e.kind in LOG_HIDDEN:
        return None
    said = event_text(e.kind, e.data)
    return None if said is None else LogLine(e.t - origin, said.text, said.tone)
