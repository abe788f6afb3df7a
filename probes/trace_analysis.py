"""Where each decode iteration's time goes, from torch-profiler chrome traces (one file per rank).

One streaming pass per file keeps only compact records (phase spans, CPU op intervals, launch
times by correlation id, kernel intervals); the file's text is never held. Then:

* the engine thread's phase spans become a timeline of disjoint segments (innermost span wins;
  `step[DRAFT ...]` takes the phase of the span around it). Iterations are the `scheduler.run_batch`
  / `specdecode.iteration` spans holding a `draft` span, else `draft`-to-`draft` windows (or
  verify-to-verify with speculation off). SGLang has no verify span: inside an iteration, the gap
  between `draft` and `step[VERIFY` is verify, from the end of `step[VERIFY` to `draft_extend` is
  verify_sample (reference §7.3); other gaps are `other`.
* prefill (`specdecode.prefill*`, SGLang's `step[EXTEND ...]` and the `draft_extend` that follows
  it) counts in the iteration after it, as the phase stream counts it: the window of that
  iteration starts at the first prefill since the previous iteration's last phase span. A
  `run_batch` holding a prefill but no draft or verify is a prefill batch: all of it is prefill,
  and the scheduling between it and the next decode batch is that iteration's `other`.
* GPU mode (the trace has kernels): kernel → correlation id (`args.correlation`, else `ac2g` flow
  events) → launching runtime call (cudaLaunchKernel, cudaGraphLaunch: graph kernels share its id)
  → the segment holding the launch. Comm kernels by name (NCCL, custom all-reduce).
* CPU mode (no kernels): work is the CPU ops on the engine thread inside the segments (their union,
  so only top-level ops count); comm is `specdecode.comm.*` spans plus gloo/c10d ops.

Must not print, exit or import anything outside the standard library, probes and msgspec (the reader's decoder).
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from probes.names import DRAFT, DRAFT_EXTEND, OTHER, PREFILL, VERIFY, VERIFY_SAMPLE
from probes.trace_names import (
    CONTAINER, INHERIT, PHASES, is_all_reduce, is_anchor, is_comm_cpu, is_comm_kernel, span_kind,
)
from probes.trace_result import IterationTimes, PhaseTime, RankAnalysis, TraceAnalysis
from probes.trace_stream import TraceFormatError, TraceReader

_KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
_RANK_IN_NAME = re.compile(r"-TP-(\d+)")
_GAP = "gap"
_US_PER_MS = 1000.0


class TraceAnalysisError(ValueError):
    """A trace that cannot be analysed (e.g. neither kernels nor phase spans); one-line message."""


# ---------------------------------------------------------------------------------------------
# Pass 1: stream the file, keep compact records


class _Collected:
    def __init__(self) -> None:
        self.events = 0
        self.spans: dict[Any, list[tuple[float, float, str, bool]]] = defaultdict(list)
        self.work: dict[Any, array] = defaultdict(lambda: array("d"))  # ts, end, ts, end, ...
        self.comm: dict[Any, array] = defaultdict(lambda: array("d"))
        self.comm_ar: dict[Any, array] = defaultdict(lambda: array("d"))   # the all-reduces among comm
        self.ar_calls: dict[Any, array] = defaultdict(lambda: array("d"))  # start of each all-reduce span
        self.comm_calls: dict[Any, array] = defaultdict(lambda: array("d"))  # start of each comm span
        # Per launch and per flow event only numbers in arrays (a dict entry per kernel would cost
        # ten times more); threads and GPU tracks become small ints through `tracks`.
        self.tracks: dict[Any, int] = {}
        self.l_corr = array("q")
        self.l_ts = array("d")
        self.l_track = array("i")
        self.fs_id = array("q")
        self.fs_ts = array("d")
        self.fs_track = array("i")
        self.fe_id = array("q")
        self.fe_ts = array("d")
        self.fe_track = array("i")
        self.k_ts = array("d")
        self.k_end = array("d")
        self.k_corr = array("q")
        self.k_comm = bytearray()
        self.k_unlinked: dict[int, tuple[int, float]] = {}  # kernel index -> (track, ts) of its flow end
        self.meta: dict[str, Any] = {}
        self.merged_ranks: set[str] = set()  # SGLang's merge_profiles renames pids "[TP00] 1234"
        self.bad_times = 0                    # events skipped for a NaN, infinite or negative ts/dur

    def track(self, key: Any) -> int:
        t = self.tracks.get(key)
        if t is None:
            t = self.tracks[key] = len(self.tracks)
        return t


_KIND_CPU, _KIND_SPAN, _KIND_KERNEL, _KIND_RUNTIME = 1, 2, 3, 4
_CAT_KIND = {"cpu_op": _KIND_CPU, "user_annotation": _KIND_SPAN,
             **{c: _KIND_KERNEL for c in _KERNEL_CATS}, **{c: _KIND_RUNTIME for c in _RUNTIME_CATS}}
_INF = math.inf


def _collect(path: Path) -> _Collected:
    # The hot loop of the analyser (one pass over every event): the reader's TraceEvent fields are
    # already typed (str, float, int|str ids), so only values and ranges are checked here.
    c = _Collected()
    comm_cpu: dict[str, bool] = {}
    comm_kernel: dict[str, int] = {}        # 0: not a collective, 1: a collective, 2: an all-reduce
    all_reduce: dict[str, bool] = {}
    kinds: dict[str, tuple[str | None, bool]] = {}
    cat_kind = _CAT_KIND
    work, comm, spans = c.work, c.comm, c.spans
    k_ts, k_end, k_corr, k_comm = c.k_ts, c.k_end, c.k_corr, c.k_comm
    reader = TraceReader(path)
    for batch in reader.record_batches():
        c.events += len(batch)
        for ev in batch:
            ph = ev.ph
            if ph == "X":
                kind = cat_kind.get(ev.cat)
                if kind is None:
                    kind = cat_kind.get(ev.cat.lower())
                    if kind is None:
                        continue
                ts, dur = ev.ts, ev.dur
                if ts is None:
                    continue
                if not (-_INF < ts < _INF and 0.0 <= dur < _INF):
                    c.bad_times += 1       # NaN, infinite or negative: said in a warning, never summed
                    continue
                end = ts + dur
                name = ev.name
                if kind == _KIND_CPU:
                    tid = ev.tid
                    w = work[tid]
                    w.append(ts)
                    w.append(end)
                    is_c = comm_cpu.get(name)
                    if is_c is None:
                        is_c = comm_cpu[name] = is_comm_cpu(name)
                    if is_c:
                        cm = comm[tid]
                        cm.append(ts)
                        cm.append(end)
                        ar = all_reduce.get(name)
                        if ar is None:
                            ar = all_reduce[name] = is_all_reduce(name)
                        if ar:
                            c.comm_ar[tid].extend((ts, end))
                elif kind == _KIND_SPAN:
                    tid = ev.tid
                    k = kinds.get(name)
                    if k is None:
                        k = kinds[name] = (span_kind(name), is_anchor(name))
                    if k[0] is not None:
                        spans[tid].append((ts, end, k[0], k[1]))
                    elif is_comm_cpu(name):
                        for store in (work[tid], comm[tid]):
                            store.append(ts)
                            store.append(end)
                        c.comm_calls[tid].append(ts)  # our communicator's span: one call each
                        if is_all_reduce(name):
                            c.comm_ar[tid].extend((ts, end))
                            c.ar_calls[tid].append(ts)
                elif kind == _KIND_KERNEL:
                    corr = _corr(ev)
                    is_c = comm_kernel.get(name)
                    if is_c is None:
                        is_c = comm_kernel[name] = (2 if is_all_reduce(name) else 1) if is_comm_kernel(name) else 0
                    if corr is None:
                        c.k_unlinked[len(k_ts)] = (c.track((ev.pid, ev.tid)), ts)
                        corr = -1
                    k_ts.append(ts)
                    k_end.append(end)
                    k_corr.append(corr)
                    k_comm.append(is_c)
                else:
                    corr = _corr(ev)
                    if corr is not None:
                        c.l_corr.append(corr)
                        c.l_ts.append(ts)
                        c.l_track.append(c.track(ev.tid))
            elif (ph == "s" or ph == "f") and ev.cat == "ac2g":
                ts, fid = ev.ts, ev.id
                if ts is None or type(fid) is not int:
                    continue
                if not (-_INF < ts < _INF and _I64_MIN <= fid <= _I64_MAX):
                    c.bad_times += 1
                    continue
                if ph == "s":
                    c.fs_id.append(fid)
                    c.fs_ts.append(ts)
                    c.fs_track.append(c.track(ev.tid))
                else:
                    c.fe_id.append(fid)
                    c.fe_ts.append(ts)
                    c.fe_track.append(c.track((ev.pid, ev.tid)))
            pid = ev.pid
            if pid.__class__ is str and pid.startswith("[TP"):
                c.merged_ranks.add(pid.split("]", 1)[0])
    c.meta = reader.meta
    return c


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _corr(ev: Any) -> int | None:
    """The event's correlation id when it is a plain integer that fits the arrays, else None."""
    a = ev.args
    corr = a.correlation if a is not None else None
    if type(corr) is int and _I64_MIN <= corr <= _I64_MAX:
        return corr
    return None


# ---------------------------------------------------------------------------------------------
# Intervals


def merge_intervals(flat: Iterable[float]) -> list[tuple[float, float]]:
    """Disjoint sorted union of intervals given flat as (start, end, start, end, ...)."""
    it = iter(flat)
    pairs = sorted(zip(it, it))
    out: list[tuple[float, float]] = []
    for s, e in pairs:
        if e < s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def overlap_per_segment(segments: list[tuple[float, float]], intervals: list[tuple[float, float]]) -> list[float]:
    """For each of the disjoint sorted `segments`, the length covered by the disjoint sorted `intervals`."""
    out = [0.0] * len(segments)
    j = 0
    n = len(intervals)
    for i, (s0, s1) in enumerate(segments):
        while j < n and intervals[j][1] <= s0:
            j += 1
        k = j
        acc = 0.0
        while k < n and intervals[k][0] < s1:
            acc += min(s1, intervals[k][1]) - max(s0, intervals[k][0])
            k += 1
        out[i] = acc
    return out


def flatten_spans(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Nested spans → disjoint segments labelled by the innermost span (INHERIT takes its parent's).

    Spans that overlap without nesting are clipped to their parent, as a profiler would nest them.
    """
    out: list[tuple[float, float, str]] = []
    stack: list[tuple[float, str]] = []  # (end, label)
    cursor = 0.0

    def emit(upto: float) -> None:
        nonlocal cursor
        if stack and upto > cursor:
            label = stack[-1][1]
            if out and out[-1][2] == label and out[-1][1] == cursor:
                out[-1] = (out[-1][0], upto, label)
            else:
                out.append((cursor, upto, label))
        cursor = max(cursor, upto)

    for ts, end, kind in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1][0] <= ts:
            emit(stack[-1][0])
            stack.pop()
        if stack:
            emit(ts)
            end = min(end, stack[-1][0])
        else:
            cursor = ts
        if kind == INHERIT:
            kind = stack[-1][1] if stack else "draft"
        stack.append((end, kind))
    while stack:
        emit(stack[-1][0])
        stack.pop()
    return out


# ---------------------------------------------------------------------------------------------
# Iterations and the labelled timeline


_DECODE_KINDS = frozenset({DRAFT, VERIFY, VERIFY_SAMPLE, DRAFT_EXTEND, OTHER})


def mark_prefill(spans: list[tuple[float, float, str, bool]]) -> list[tuple[float, float, str, bool]]:
    """Spans with SGLang's prefill made explicit: a `draft_extend` whose last phase span before it
    is a prefill is the draft's prefill (`_draft_extend_for_prefill`), and a container holding a
    prefill but no draft or verify (a prefill batch's run_batch) becomes one prefill span."""
    out = []
    last = None
    for ts, end, kind, anchor in sorted(spans, key=lambda s: (s[0], -s[1])):
        if kind == DRAFT_EXTEND and last == PREFILL:
            kind = PREFILL
        elif kind in _DECODE_KINDS or kind == PREFILL:
            last = kind
        out.append((ts, end, kind, anchor))
    containers = [(s[0], s[1]) for s in out if s[2] == CONTAINER]
    if containers:
        starts = sorted((s[0], s[2]) for s in out if s[2] in (PREFILL, DRAFT, VERIFY))
        keys = [t for t, _ in starts]
        for c0, c1 in containers:
            inside = {k for _, k in starts[bisect_right(keys, c0 - 1e-9):bisect_right(keys, c1)]}
            if PREFILL in inside and not inside & {DRAFT, VERIFY}:
                out.append((c0, c1, PREFILL, False))
    return out


def _decode_windows(spans: list[tuple[float, float, str, bool]]) -> tuple[list[tuple[float, float]], bool]:
    """The decode iterations' windows, and whether they tile the time (anchor to anchor)."""
    anchors = sorted((s[0], s[1]) for s in spans if s[3])
    if not anchors:
        anchors = sorted((s[0], s[1]) for s in spans if s[2] == "verify")
    if not anchors:
        return [], False
    containers = sorted((s[0], s[1]) for s in spans if s[2] == CONTAINER)
    windows = []
    j = 0
    for c0, c1 in containers:
        while j < len(anchors) and anchors[j][0] < c0:
            j += 1
        if j < len(anchors) and anchors[j][0] < c1:
            windows.append((c0, c1))
    if windows:
        return windows, False
    last_end = max(s[1] for s in spans if s[2] != CONTAINER)
    starts = [a[0] for a in anchors]
    return [(s, starts[i + 1] if i + 1 < len(starts) else max(last_end, anchors[i][1]))
            for i, s in enumerate(starts)], True


def _with_prefill(windows: list[tuple[float, float]], spans: list[tuple[float, float, str, bool]],
                  contiguous: bool) -> list[tuple[float, float]]:
    """Each window starts earlier to take in the prefills since the previous iteration: after the
    previous window (containers) or after the last decode phase span before it (anchors). The last
    window ends before prefills that follow its phases (their iteration is not in the trace)."""
    prefill = sorted(s[0] for s in spans if s[2] == PREFILL)
    if not prefill or not windows:
        return windows
    decode_ends = sorted(s[1] for s in spans if s[2] in _DECODE_KINDS)
    out = []
    prev_end = -math.inf
    for w0, w1 in windows:
        if contiguous:
            k = bisect_right(decode_ends, w0)
            lim = decode_ends[k - 1] if k else -math.inf
        else:
            lim = prev_end
        i = bisect_right(prefill, lim - 1e-9)
        if i < len(prefill) and prefill[i] < w0:
            w0 = prefill[i]
        out.append((w0, w1))
        prev_end = w1
    if contiguous:
        out = [(a, out[i + 1][0] if i + 1 < len(out) else b) for i, (a, b) in enumerate(out)]
        # Prefills after the last iteration's phases belong to an iteration the trace ends before.
        a, b = out[-1]
        i = bisect_right(prefill, (decode_ends[-1] if decode_ends else a) - 1e-9)
        if i < len(prefill) and a < prefill[i] < b:
            out[-1] = (a, prefill[i])
    return out


def _label_window(w0: float, w1: float, segs: list[tuple[float, float, str]], derive: bool) -> list[tuple[float, float, str]]:
    """Partition [w0, w1) into labelled segments; gaps become derived verify phases or `other`."""
    parts: list[tuple[float, float, str]] = []
    cursor = w0
    for s0, s1, label in segs:
        s0, s1 = max(s0, w0), min(s1, w1)
        if s1 <= s0:
            continue
        if s0 > cursor:
            parts.append((cursor, s0, _GAP))
        parts.append((s0, s1, label))
        cursor = s1
    if cursor < w1:
        parts.append((cursor, w1, _GAP))
    if not derive:
        return [(a, b, OTHER if lab == _GAP else lab) for a, b, lab in parts]
    # SGLang: verify runs from the end of draft to draft_extend; step[VERIFY is its target forward,
    # what follows it (eagle_sample, commit) is verify_sample.
    d_end = next((b for a, b, lab in reversed(parts) if lab == DRAFT), None)
    x_start = next((a for a, b, lab in parts if lab == DRAFT_EXTEND and (d_end is None or a >= d_end)), w1)
    v = [(a, b) for a, b, lab in parts if lab == VERIFY and d_end is not None and a >= d_end and b <= x_start]
    out = []
    for a, b, lab in parts:
        if lab == _GAP:
            lab = OTHER
            if d_end is not None and a >= d_end and b <= x_start:
                lab = VERIFY if not v or b <= v[0][0] else (VERIFY_SAMPLE if a >= v[-1][1] else VERIFY)
        out.append((a, b, lab))
    return out


class _Timeline:
    """Disjoint labelled segments of the engine thread, each tagged with its iteration."""

    def __init__(self, windows: list[tuple[float, float]], segs: list[tuple[float, float, str]], derive: bool):
        self.windows = windows
        self.starts: list[float] = []
        self.segments: list[tuple[float, float]] = []
        self.labels: list[int] = []
        self.iters: list[int] = []
        pidx = {p: i for i, p in enumerate(PHASES)}
        j = 0
        for it, (w0, w1) in enumerate(windows):
            while j < len(segs) and segs[j][1] <= w0:
                j += 1
            k = j
            inside = []
            while k < len(segs) and segs[k][0] < w1:
                inside.append(segs[k])
                k += 1
            for a, b, lab in _label_window(w0, w1, inside, derive):
                self.starts.append(a)
                self.segments.append((a, b))
                self.labels.append(pidx[lab])
                self.iters.append(it)

    def locate(self, t: float) -> tuple[int, int] | None:
        """(iteration, phase index) of the segment holding time t, or None outside iterations."""
        i = bisect_right(self.starts, t) - 1
        if i < 0 or t >= self.segments[i][1]:
            return None
        return self.iters[i], self.labels[i]


# ---------------------------------------------------------------------------------------------
# One rank


def analyze_file(path: str | Path, rank: int | None = None) -> RankAnalysis:
    """Analyse one rank's trace file. Raises TraceFormatError / TraceAnalysisError (one line)."""
    path = Path(path)
    c = _collect(path)
    if len(c.merged_ranks) > 1:
        raise TraceAnalysisError(
            f"{path.name}: a merged trace of {len(c.merged_ranks)} ranks (merge_profiles); "
            "analyse the per-rank files {profile_id}-TP-{rank}.trace.json.gz instead")
    if rank is None:
        rank = _rank_of(path, c.meta)
    n_kernels = len(c.k_ts)
    phase_threads = {tid: sum(1 for s in ss if s[2] != CONTAINER) for tid, ss in c.spans.items()}
    phase_threads = {t: n for t, n in phase_threads.items() if n}
    if not n_kernels and not phase_threads:
        raise TraceAnalysisError(
            f"{path.name}: neither GPU kernels nor phase spans (draft, step[VERIFY ...], "
            f"specdecode.*) in {c.events} events; was the profiler running during decode?")
    mode = "gpu" if n_kernels else "cpu"
    thread = max(phase_threads, key=phase_threads.__getitem__) if phase_threads else None
    spans = mark_prefill(c.spans.get(thread, [])) if thread is not None else []
    decode, contiguous = _decode_windows(spans)
    windows = _with_prefill(decode, spans, contiguous)
    derive = not any(s[2] == VERIFY_SAMPLE for s in spans)
    segs = flatten_spans([(s[0], s[1], s[2]) for s in spans if s[2] != CONTAINER])
    if not windows:
        # No phase spans at all (a GPU trace without annotations): one window, everything `other`.
        lo = min(c.k_ts) if n_kernels else 0.0
        hi = max(c.k_end) if n_kernels else 0.0
        windows = [(min(lo, min(c.l_ts, default=lo)), hi)]
        derive = False
    timeline = _Timeline(windows, segs, derive)
    result = RankAnalysis(rank=rank, file=path.name, mode=mode, thread=str(thread),
                          events=c.events, kernels=n_kernels,
                          phase_spans=phase_threads.get(thread, 0), derived_verify=derive,
                          base_time_ns=_int_or_none(c.meta.get("baseTimeNanoseconds")),
                          world_size=_world_size(c.meta), bad_times=c.bad_times)
    iters = [IterationTimes(index=i, start_us=w[0], decode_start_us=d[0])
             for i, (w, d) in enumerate(zip(windows, decode if len(decode) == len(windows) else windows))]
    _span_times(timeline, iters)
    if mode == "cpu":
        _cpu_work(c, thread, timeline, iters)
    else:
        _gpu_work(c, thread, timeline, iters, result)
    result.iterations = iters
    return result


def _span_times(tl: _Timeline, iters: list[IterationTimes]) -> None:
    for (a, b), lab, it in zip(tl.segments, tl.labels, tl.iters):
        iters[it].phases[PHASES[lab]].span_ms += (b - a) / _US_PER_MS


def _cpu_work(c: _Collected, thread: Any, tl: _Timeline, iters: list[IterationTimes]) -> None:
    work = merge_intervals(c.work.get(thread, ()))
    comm = merge_intervals(c.comm.get(thread, ()))
    busy = overlap_per_segment(tl.segments, work)
    comm_busy = overlap_per_segment(tl.segments, comm)
    ar_busy = overlap_per_segment(tl.segments, merge_intervals(c.comm_ar.get(thread, ())))
    for ts in c.ar_calls.get(thread, ()):
        where = tl.locate(ts)
        if where is not None:
            iters[where[0]].phases[PHASES[where[1]]].ar_calls += 1
    for ts in c.comm_calls.get(thread, ()):
        where = tl.locate(ts)
        if where is not None:
            iters[where[0]].phases[PHASES[where[1]]].comm_calls += 1
    for i, (lab, it) in enumerate(zip(tl.labels, tl.iters)):
        p = iters[it].phases[PHASES[lab]]
        p.ms += busy[i] / _US_PER_MS
        p.comm_ms += comm_busy[i] / _US_PER_MS
        p.ar_ms += ar_busy[i] / _US_PER_MS
        iters[it].busy_ms += busy[i] / _US_PER_MS
        iters[it].comm_ms += comm_busy[i] / _US_PER_MS
    for it, (w0, w1) in zip(iters, tl.windows):
        it.wall_ms = (w1 - w0) / _US_PER_MS


class _Union:
    """Union length of intervals fed in start order, in O(1) memory."""

    __slots__ = ("start", "end", "total")

    def __init__(self) -> None:
        self.start = self.end = float("-inf")
        self.total = 0.0

    def feed(self, s: float, e: float) -> None:
        if s > self.end:
            if self.end > self.start:
                self.total += self.end - self.start
            self.start, self.end = s, e
        elif e > self.end:
            self.end = e

    def length(self) -> float:
        return self.total + (self.end - self.start if self.end > self.start else 0.0)


def _gpu_work(c: _Collected, thread: Any, tl: _Timeline, iters: list[IterationTimes], result: RankAnalysis) -> None:
    # Flows fill in correlation ids the kernels lack (only then is a lookup built).
    if c.k_unlinked:
        by_end = {(tr, ts): fid for fid, ts, tr in zip(c.fe_id, c.fe_ts, c.fe_track)}
        for idx, key in c.k_unlinked.items():
            fid = by_end.get(key)
            if fid is not None:
                c.k_corr[idx] = fid
    launches = _LaunchIndex(c)
    main_track = c.tracks.get(thread, -1)
    busy: dict[tuple[int, int], _Union] = defaultdict(_Union)
    comm: dict[tuple[int, int], _Union] = defaultdict(_Union)
    ar: dict[tuple[int, int], _Union] = defaultdict(_Union)
    ar_calls: dict[tuple[int, int], int] = defaultdict(int)
    comm_calls: dict[tuple[int, int], int] = defaultdict(int)
    all_busy: dict[int, _Union] = defaultdict(_Union)
    all_comm: dict[int, _Union] = defaultdict(_Union)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    other = PHASES.index(OTHER)
    k_ts, k_end, k_corr, k_comm = c.k_ts, c.k_end, c.k_corr, c.k_comm
    n = len(k_ts)
    # Exporters write kernels in time order; sort (a list of n indices) only when they are not.
    in_order = all(k_ts[j] <= k_ts[j + 1] for j in range(n - 1))
    for i in range(n) if in_order else sorted(range(n), key=k_ts.__getitem__):
        s, e = k_ts[i], k_end[i]
        launch, track = launches.get(k_corr[i])
        where = tl.locate(launch) if launch is not None else None
        if where is None:
            if launch is None:
                result.unattributed_kernels += 1
                result.unattributed_ms += (e - s) / _US_PER_MS
            continue
        it, lab = where
        if track != main_track:
            lab = other  # launched by another thread: its iteration by time, but no phase
        busy[(it, lab)].feed(s, e)
        all_busy[it].feed(s, e)
        if k_comm[i]:
            comm_calls[(it, lab)] += 1
            comm[(it, lab)].feed(s, e)
            all_comm[it].feed(s, e)
            if k_comm[i] == 2:
                ar[(it, lab)].feed(s, e)
                ar_calls[(it, lab)] += 1
        if it not in first:
            first[it] = s
        last[it] = max(last.get(it, e), e)
    for (it, lab), u in busy.items():
        iters[it].phases[PHASES[lab]].ms = u.length() / _US_PER_MS
    for (it, lab), u in comm.items():
        iters[it].phases[PHASES[lab]].comm_ms = u.length() / _US_PER_MS
    for (it, lab), n_calls in comm_calls.items():
        iters[it].phases[PHASES[lab]].comm_calls = n_calls
    for (it, lab), u in ar.items():
        iters[it].phases[PHASES[lab]].ar_ms = u.length() / _US_PER_MS
        iters[it].phases[PHASES[lab]].ar_calls = ar_calls[(it, lab)]
    order = sorted(first)
    for j, it in enumerate(order):
        # The GPU's iteration runs from its first kernel to the next iteration's first kernel, so
        # the gaps between iterations (scheduling, sampling on the CPU) count as its idle time.
        end = first[order[j + 1]] if j + 1 < len(order) else last[it]
        iters[it].wall_ms = (end - first[it]) / _US_PER_MS
        iters[it].busy_ms = all_busy[it].length() / _US_PER_MS
        iters[it].comm_ms = all_comm[it].length() / _US_PER_MS


def _world_size(meta: dict[str, Any]) -> int | None:
    info = meta.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class _LaunchIndex:
    """correlation id -> (launch ts, thread track), from runtime events, else from flow starts.

    CUPTI correlation ids count up through every CUDA API call, so they are dense: a flat array
    over their range costs 12 bytes per id; sparse ids fall back to a dict.
    """

    def __init__(self, c: _Collected):
        count = len(c.l_corr) + len(c.fs_id)
        self.lo = min(min(c.l_corr, default=0), min(c.fs_id, default=0)) if count else 0
        hi = max(max(c.l_corr, default=self.lo), max(c.fs_id, default=self.lo)) if count else -1
        size = hi - self.lo + 1 if count else 0
        self.dense = size <= 4 * count + 4096
        if self.dense:
            self.ts = array("d", [math.nan]) * size
            self.track = array("i", [-1]) * size
        else:
            self.map: dict[int, tuple[float, int]] = {}
        for corr, ts, tr in zip(c.l_corr, c.l_ts, c.l_track):
            self._put(corr, ts, tr, overwrite=True)
        for corr, ts, tr in zip(c.fs_id, c.fs_ts, c.fs_track):
            self._put(corr, ts, tr, overwrite=False)  # a flow only where the runtime event had no id

    def _put(self, corr: int, ts: float, tr: int, overwrite: bool) -> None:
        if self.dense:
            i = corr - self.lo
            if overwrite or math.isnan(self.ts[i]):
                self.ts[i] = ts
                self.track[i] = tr
        elif overwrite or corr not in self.map:
            self.map[corr] = (ts, tr)

    def get(self, corr: int) -> tuple[float | None, int]:
        if self.dense:
            i = corr - self.lo
            if 0 <= i < len(self.ts) and not math.isnan(self.ts[i]):
                return self.ts[i], self.track[i]
            return None, -1
        return self.map.get(corr, (None, -1))


def _rank_of(path: Path, meta: dict[str, Any]) -> int:
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1))
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and type(info.get("rank")) is int:
        return info["rank"]
    return 0


# ---------------------------------------------------------------------------------------------
# Many ranks


_TRACE_SUFFIXES = (".trace.json.gz", ".trace.json")
_JSON_SUFFIXES = (".json.gz", ".json")


def find_rank_files(directory: str | Path) -> list[Path]:
    """The rank files of the one capture in `directory` (SGLang naming `{id}-TP-{rank}...`)."""
    directory = Path(directory)
    entries = [p for p in directory.iterdir() if p.is_file() and not p.name.startswith("merged-")]
    # Prefer the profiler's own naming; take any JSON only when no file is named like a trace.
    files = sorted(p for p in entries if p.name.endswith(_TRACE_SUFFIXES)) or sorted(
        p for p in entries if p.name.endswith(_JSON_SUFFIXES))
    if not files:
        raise TraceAnalysisError(f"{directory}: no trace files (*.trace.json.gz) in this directory")
    captures: dict[str, list[Path]] = defaultdict(list)
    for p in files:
        m = _RANK_IN_NAME.search(p.name)
        captures[p.name[:m.start()] if m else p.name].append(p)
    if len(captures) > 1:
        names = ", ".join(sorted(captures)[:4])
        raise TraceAnalysisError(
            f"{directory}: holds {len(captures)} captures ({names}{', ...' if len(captures) > 4 else ''}); "
            "pass one file or a directory with one capture")
    return next(iter(captures.values()))


def analyze_paths(paths: list[Path], progress: Callable[[str], None] | None = None) -> TraceAnalysis:
    """Analyse every rank file of one capture and compare the ranks."""
    ranks: list[RankAnalysis] = []
    for p in paths:
        if progress:
            progress(f"analysing {p.name}")
        ranks.append(analyze_file(p))
    ranks.sort(key=lambda r: r.rank)
    warnings: list[str] = []
    seen: set[int] = set()
    for r in ranks:
        if r.rank in seen:
            raise TraceAnalysisError(f"two files claim rank {r.rank}; pass the files of one capture")
        seen.add(r.rank)
        if r.unattributed_kernels:
            warnings.append(f"rank {r.rank}: {r.unattributed_kernels} kernels "
                            f"({r.unattributed_ms:.3f} ms) have no launching call in the trace")
        if not r.iterations or (r.phase_spans == 0):
            warnings.append(f"rank {r.rank}: no phase spans; all time is reported as `other`")
        if r.bad_times:
            warnings.append(f"rank {r.rank}: {r.bad_times} events with a NaN, infinite or negative ts/dur "
                            "were left out")
    warnings += _capture_checks(ranks)
    counts = {r.rank: len(r.iterations) for r in ranks}
    if len(set(counts.values())) > 1:
        warnings.append(f"ranks have different iteration counts {counts}; "
                        f"compared the first {min(counts.values())} of each")
    if len({r.mode for r in ranks}) > 1:
        warnings.append("ranks were analysed in different modes (some traces have kernels, some not)")
    return TraceAnalysis(ranks=ranks, warnings=warnings)


# Ranks of one capture start their profilers within seconds of each other; files whose clocks are
# further apart than this come from different captures.
SAME_CAPTURE_S = 600.0


def _capture_checks(ranks: list[RankAnalysis]) -> list[str]:
    """Warnings when the rank files do not look like one capture: different world sizes, ranks
    outside the world or missing from it, profiler clocks far apart (baseTimeNanoseconds)."""
    out: list[str] = []
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    if len(sizes) > 1:
        out.append(f"the files disagree on the world size ({sorted(sizes)}): they are not one capture")
    elif sizes:
        ws = sizes.pop()
        outside = [r.rank for r in ranks if not 0 <= r.rank < ws]
        if outside:
            out.append(f"ranks {outside} are outside the world size {ws} the files state: not one capture")
        elif len(ranks) > 1 and len(ranks) < ws:
            missing = sorted(set(range(ws)) - {r.rank for r in ranks})
            out.append(f"ranks {missing} of a world of {ws} are missing; compared the {len(ranks)} present")
    bases = [r.base_time_ns for r in ranks if r.base_time_ns is not None]
    if len(bases) > 1 and (max(bases) - min(bases)) / 1e9 > SAME_CAPTURE_S:
        out.append(f"the files' profiler clocks (baseTimeNanoseconds) are {(max(bases) - min(bases)) / 1e9:.0f} s "
                   "apart: they look like different captures")
    return out


def analyze_path(path: str | Path, progress: Callable[[str], None] | None = None) -> TraceAnalysis:
    """Analyse a trace file or a directory of one capture's rank files."""
    path = Path(path)
    if path.is_dir():
        return analyze_paths(find_rank_files(path), progress)
    if not path.exists():
        raise TraceAnalysisError(f"{path}: no such file or directory")
    if not path.is_file():
        # A FIFO would block open() for ever, a device never end: refuse before opening.
        raise TraceAnalysisError(f"{path}: not a regular file (a FIFO, device or socket), not a trace")
    return analyze_paths([path], progress)


__all__ = [
    "TraceAnalysisError", "TraceFormatError", "analyze_file", "analyze_path", "analyze_paths",
    "find_rank_files", "flatten_spans", "merge_intervals", "overlap_per_segment", "PhaseTime",
]
