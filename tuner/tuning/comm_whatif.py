"""What a server really lets the operator do about its collectives, predicted per phase.

On SGLang 0.5.23 the draft cannot leave the TP group (sglang-draft-placement.md §1). What the
operator can change is the step count (live with the plugin, or per batch size: `sglang-flags`) and,
at launch, the all-reduce path: `SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1` moves decode-sized bf16
all-reduces on the `tp` group from NCCL to FlashInfer's PCIe-IPC kernels (the draft's, the
target's verify and the draft-extend's; the logits all-gather and prefill stay on NCCL).

`pcie_ipc()` predicts that relaunch from a trace capture's per-phase all-reduce time and count
(probes/trace_analysis `ar_ms`, `ar_calls`) and the plugin's report of the path each call takes now
(`specdecode_allreduce`): only the calls PCIe-IPC would take are replaced, each by its time divided
by SGLang's own measured speed-up at that message size (pcie_ipc_ar.py:15-24, 8×SM120, hidden
6144), and the result is bounded by SGLang's own end-to-end row (TPOT 21.14 → 13.62 ms,
pcie_ipc_ar.py:39-45). Draft placement is predicted too, for reference only.

`emulated()` is the same arithmetic on our engine, whose `--emulate-comm-latency A` adds A µs to
every collective: what a relaunch with another A would give (an emulation: sleep cannot emulate a
few microseconds, so it checks the model's arithmetic, not real PCIe hardware).

`remedy_lines()` words it once for the TUI, `tune`, `once` and the report. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from probes.names import DRAFT, DRAFT_EXTEND, VERIFY

PCIE_IPC_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
KIB = 1024
# (message bytes, PCIe-IPC µs, NCCL µs): SGLang's table, pcie_ipc_ar.py:18-24
PCIE_IPC_TABLE: tuple[tuple[int, float, float], ...] = (
    (12 * KIB, 5.3, 205.1), (96 * KIB, 15.3, 584.9), (384 * KIB, 34.6, 1169.3), (100 * KIB * KIB, 8500.0, 50400.0))
PCIE_IPC_TPOT_MS = (21.14, 13.62)          # NCCL only vs decode-sized workspace, pcie_ipc_ar.py:39-45
E2E_BOUND = PCIE_IPC_TPOT_MS[0] / PCIE_IPC_TPOT_MS[1]
PCIE_WORLD_SIZES = (2, 4, 8)               # pcie_ipc_ar.py:84
TABLE_CITE = "SGLang's PCIe-IPC table (pcie_ipc_ar.py:15-45: 8×SM120, hidden 6144)"
PHASE_ROWS = {DRAFT: "bs", VERIFY: "bs×N", DRAFT_EXTEND: "bs×N"}


def ipc_speedup(nbytes: float) -> float:
    """NCCL ÷ PCIe-IPC time at a message size: SGLang's table, interpolated in log-log, flat beyond."""
    pts = [(math.log(b), math.log(nccl / ipc)) for b, ipc, nccl in PCIE_IPC_TABLE]
    x = math.log(max(1.0, nbytes))
    if x <= pts[0][0]:
        return math.exp(pts[0][1])
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return math.exp(pts[-1][1])


@dataclass(frozen=True)
class PhaseSaving:
    phase: str
    ar_ms: float          # per iteration, measured
    ar_calls: float
    rows: int             # per call
    nbytes: int
    speedup: float
    saved_ms: float
    path_now: str


@dataclass(frozen=True)
class CommPrediction:
    """A relaunch's predicted decode iteration; `reason` (n/a) when it cannot be predicted or does
    not apply, `notes` what the figure assumes."""
    remedy: str
    iter_ms: float = math.nan
    predicted_ms: float = math.nan
    ratio: float = math.nan                # tok/s after ÷ now (acceptance unchanged)
    unbounded_ratio: float = math.nan
    bounded: bool = False
    phases: tuple[PhaseSaving, ...] = ()
    reason: str = ""
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reason and math.isfinite(self.ratio)


def _paths_now(report: Mapping[str, Any] | None, phase: str, bs: int) -> str | None:
    if not isinstance(report, Mapping):
        return None
    paths = report.get("paths", {})
    table = paths.get("draft" if phase == DRAFT else "verify", {}) if isinstance(paths, Mapping) else {}
    if not isinstance(table, Mapping) or not table:
        return None
    sizes = sorted(int(k) for k in table if str(k).isdigit())
    pick = next((s for s in sizes if s >= bs), sizes[-1] if sizes else None)   # padded to a graph size
    return None if pick is None else str(table.get(str(pick)))


def pcie_ipc(mean_iteration: Mapping[str, Any], report: Mapping[str, Any] | None, bs: int,
             draft_tokens: int, hidden: int | None = None) -> CommPrediction:
    """SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 at launch, from one rank's mean iteration of a capture."""
    remedy = f"{PCIE_IPC_ENV}=1"
    wall = float(mean_iteration.get("wall_ms", math.nan))
    phases = mean_iteration.get("phases", {})
    if not math.isfinite(wall) or wall <= 0 or not isinstance(phases, Mapping):
        return CommPrediction(remedy, reason="no decode iteration in the capture")
    if not any(isinstance(phases.get(p), Mapping) and "ar_calls" in phases[p] for p in PHASE_ROWS):
        return CommPrediction(remedy, iter_ms=wall, reason="the capture's analysis predates per-call all-reduce "
                              "times: capture again (c)")
    notes: list[str] = []
    if isinstance(report, Mapping):
        ws = report.get("world_size")
        if isinstance(ws, int) and ws not in PCIE_WORLD_SIZES:
            return CommPrediction(remedy, iter_ms=wall, reason=f"PCIe-IPC builds only at TP 2, 4 or 8, not {ws}")
        if report.get("deterministic"):
            return CommPrediction(remedy, iter_ms=wall, reason="deterministic inference keeps PCIe-IPC off")
        hidden = hidden or report.get("hidden")
        if report.get("full_nvlink"):
            notes.append("the plugin reports full NVLink: this is not a PCIe-only host")
    else:
        notes.append("the plugin does not report the all-reduce paths: every decode all-reduce taken as NCCL")
    if not isinstance(hidden, int) or hidden <= 0:
        return CommPrediction(remedy, iter_ms=wall, reason="the hidden size is unknown (the plugin reports it)")
    out: list[PhaseSaving] = []
    for ph, rows_of in PHASE_ROWS.items():
        t = phases.get(ph)
        if not isinstance(t, Mapping):
            continue
        ar_ms, calls = float(t.get("ar_ms", 0.0)), float(t.get("ar_calls", 0.0))
        rows = bs if rows_of == "bs" else bs * draft_tokens
        nbytes = rows * hidden * 2                                      # bf16
        now = _paths_now(report, ph, bs) or "nccl"
        # PCIe-IPC comes after custom all-reduce (parallel_state.py:949-975): a call custom
        # all-reduce serves, or one PCIe-IPC already serves, saves nothing.
        sp = ipc_speedup(nbytes) if now == "nccl" else 1.0
        saved = ar_ms * (1.0 - 1.0 / sp) if ar_ms > 0 else 0.0
        out.append(PhaseSaving(ph, ar_ms, calls, rows, nbytes, sp, saved, now))
    already = {p.path_now for p in out if p.ar_calls > 0}
    if already and already <= {"pcie_ipc"}:
        return CommPrediction(remedy, iter_ms=wall, phases=tuple(out), reason="already on PCIe-IPC")
    if already and "nccl" not in already:
        return CommPrediction(remedy, iter_ms=wall, phases=tuple(out),
                              reason=f"these all-reduces already run on {'/'.join(sorted(already))}, before PCIe-IPC")
    saved = sum(p.saved_ms for p in out)
    predicted = max(1e-9, wall - saved)
    raw = wall / predicted
    bounded = raw > E2E_BOUND
    ratio = min(raw, E2E_BOUND)
    return CommPrediction(remedy, iter_ms=wall, predicted_ms=wall / ratio, ratio=ratio, unbounded_ratio=raw,
                          bounded=bounded, phases=tuple(out), notes=tuple(notes))


def placement_reference(mean_iteration: Mapping[str, Any], tp_size: int | None) -> tuple[float, float] | None:
    """tok/s ratio (low, high) if the draft left the TP group: its collectives removed, its
    compute × TP (low) or as is (high); None without draft collectives or TP 1."""
    wall = float(mean_iteration.get("wall_ms", math.nan))
    phases = mean_iteration.get("phases", {})
    if not tp_size or tp_size <= 1 or not math.isfinite(wall) or wall <= 0 or not isinstance(phases, Mapping):
        return None
    comm = compute = 0.0
    for ph in (DRAFT, DRAFT_EXTEND):
        t = phases.get(ph) if isinstance(phases.get(ph), Mapping) else {}
        comm += float(t.get("comm_ms", 0.0))
        compute += max(0.0, float(t.get("ms", 0.0)) - float(t.get("comm_ms", 0.0)))
    if comm <= 0:
        return None
    high = wall / max(1e-9, wall - comm)
    low = wall / max(1e-9, wall - comm + compute * (tp_size - 1))
    return low, high


def emulated(iter_ms: float, calls: Mapping[str, float], old_us: float, new_us: float) -> CommPrediction:
    """Our engine relaunched with `--emulate-comm-latency new_us` instead of old_us: every
    collective's emulated part moves by (new - old) µs. `calls`: collectives per iteration by phase."""
    label = f"--emulate-comm-latency {new_us:g}" if new_us else "no emulated latency"
    n = sum(float(v) for v in calls.values())
    if not math.isfinite(iter_ms) or iter_ms <= 0 or n <= 0:
        return CommPrediction(label, reason="no collectives measured per iteration")
    predicted = iter_ms + n * (new_us - old_us) / 1000.0
    if predicted <= 0:
        return CommPrediction(label, iter_ms=iter_ms, reason="the emulated latency is larger than the iteration")
    return CommPrediction(label, iter_ms=iter_ms, predicted_ms=predicted, ratio=iter_ms / predicted,
                          unbounded_ratio=iter_ms / predicted,
                          notes=("emulation: sleep cannot emulate a few microseconds; this checks the "
                                 "arithmetic, not PCIe hardware",))


def _pct(r: float) -> str:
    return f"{(r - 1) * 100:+.0f} %"


def remedy_lines(kind: str, ipc: CommPrediction | None, placement: tuple[float, float] | None,
                 pinnable: Sequence[int] | None = None) -> list[str]:
    """The same words everywhere: what the operator can change on this server, with predictions."""
    lines: list[str] = []
    if kind == "sglang":
        steps = ("steps: live among the pinnable tiers " + " ".join(map(str, pinnable))
                 if pinnable else "steps: live with the plugin on an adaptive launch")
        lines.append(steps + "; per batch size: `specdecode-tune sglang-flags`")
    if ipc is not None:
        if ipc.ok:
            per = ", ".join(f"{p.phase} {p.ar_calls:g}×{p.nbytes / KIB:.0f} KiB −{p.saved_ms:.2f} ms"
                            for p in ipc.phases if p.ar_calls > 0)
            bound = (f", capped at SGLang's own end-to-end {E2E_BOUND:.2f}× (model said {ipc.unbounded_ratio:.2f}×)"
                     if ipc.bounded else f"; SGLang's own end-to-end gain was {E2E_BOUND:.2f}×")
            lines.append(f"all-reduce path: relaunch with {ipc.remedy}: decode iteration {ipc.iter_ms:.2f} → "
                         f"{ipc.predicted_ms:.2f} ms, tok/s {_pct(ipc.ratio)} (predicted: {per}; {TABLE_CITE}{bound})")
            lines += [f"  note: {n}" for n in ipc.notes]
        else:
            lines.append(f"all-reduce path ({ipc.remedy}): n/a, {ipc.reason}")
    if placement is not None:
        low, high = placement
        where = ("not an SGLang 0.5.23 setting, for reference" if kind == "sglang" else "p changes it live")
        lines.append(f"draft placement off the TP group: {where}: tok/s {_pct(low)} … {_pct(high)} "
                     "(its collectives removed, its compute ×TP … as is)")
    return lines


def _latency_us(spec: Any) -> float | None:
    """The A of an engine's `--emulate-comm-latency A[,B]` (None: not emulated or unreadable)."""
    if not isinstance(spec, str) or not spec.strip():
        return None
    try:
        return float(spec.split(",")[0])
    except ValueError:
        return None


def remedies_for(info: Mapping[str, Any], analysis: Mapping[str, Any] | None, bs: float | None,
                 pinnable: Sequence[int] | None = None) -> list[str]:
    """The remedy lines for a server (its normalized /server_info: kind, tp_size, active, launch, and
    on SGLang the plugin's `allreduce` report) and its newest capture's analysis (None: none yet)."""
    kind = str(info.get("kind", ""))
    ranks = (analysis or {}).get("ranks") or []
    mean = (ranks[0].get("mean") or {}) if ranks and isinstance(ranks[0], Mapping) else None
    tp = info.get("tp_size") if isinstance(info.get("tp_size"), int) else None
    active = info.get("active") or {}
    n = active.get("speculative_num_draft_tokens")
    batch = max(1, round(bs)) if isinstance(bs, (int, float)) and math.isfinite(bs) and bs > 0 else 1
    if kind == "sglang":
        report = info.get("allreduce") if isinstance(info.get("allreduce"), Mapping) else None
        counted = collectives_line(info.get("collectives"), active.get("speculative_num_steps"))
        if mean is None:
            ipc = CommPrediction(f"{PCIE_IPC_ENV}=1", reason="needs a capture (c): SGLang's collectives run inside "
                                 "CUDA graphs, so only a trace times each call")
        else:
            ipc = pcie_ipc(mean, report, batch, n if isinstance(n, int) and n > 0 else 1)
        lines = remedy_lines(kind, ipc, placement_reference(mean, tp) if mean else None, pinnable)
        return lines + ([counted] if counted else [])
    lat = _latency_us((info.get("launch") or {}).get("emulate_comm_latency"))
    if mean is None or lat is None:
        return []
    calls = {p: float((t or {}).get("comm_calls", 0.0)) for p, t in (mean.get("phases") or {}).items()}
    pred = emulated(float(mean.get("wall_ms", math.nan)), calls, lat, 0.0)
    if not pred.ok:
        return [f"emulated collectives ({lat:g} µs each): n/a, {pred.reason}"]
    return [f"emulated collectives (--emulate-comm-latency {lat:g}, the engine's stand-in for a slow link): a "
            f"relaunch without them: decode iteration {pred.iter_ms:.2f} → {pred.predicted_ms:.2f} ms, tok/s "
            f"{_pct(pred.ratio)} ({sum(calls.values()):g} collectives per iteration × {lat:g} µs; an emulation, "
            "not hardware: on SGLang the remedy is PCIe-IPC)"]


def pcie_ipc_offer(info: Mapping[str, Any]) -> bool:
    """The plugin reports NCCL for decode all-reduces on a PCIe-only group PCIe-IPC could serve."""
    r = info.get("allreduce")
    if info.get("kind") != "sglang" or not isinstance(r, Mapping) or r.get("pcie_ipc_env") or r.get("deterministic"):
        return False
    if r.get("full_nvlink") is not False or r.get("world_size") not in PCIE_WORLD_SIZES:
        return False
    paths = r.get("paths") if isinstance(r.get("paths"), Mapping) else {}
    draft = paths.get("draft") if isinstance(paths.get("draft"), Mapping) else {}
    return bool(draft) and all(v == "nccl" for v in draft.values())


def session_remedies(session: Any) -> list[str]:
    """remedies_for over a live or recorded session: its server info, the newest analysed capture in
    its store, the mean running batch and the steps its backend takes live; plus, where the plugin
    reports NCCL on a PCIe-only group, how to apply the relaunch."""
    from tuner.core import series as S
    from tuner.core.records import thaw

    store = session.store
    traces = [tr for tr in store.traces() if tr.analysis is not None]
    batch = store.latest(S.SERVER_BATCH)
    backend = session.backend
    pin = backend.capabilities.allowed_values("speculative_num_steps") if backend is not None else None
    info = session.server_info()
    lines = remedies_for(info, thaw(traces[-1].analysis) if traces else None,
                         batch.value if batch else None, pin)
    if pcie_ipc_offer(info):
        lines.append(f"the plugin reports NCCL on a PCIe-only TP group: `specdecode-tune launch --try "
                     f"{PCIE_IPC_ENV}=1 -- …` or relaunch with it in the server's environment")
    return lines


def collectives_line(counts: Any, steps: Any) -> str:
    """The plugin's collectives per forward, per phase at the active steps, labelled "computed": on
    SGLang they run inside CUDA graphs, where nothing counts them live."""
    from probes.inserver.sglang_comm import per_phase

    if not isinstance(counts, Mapping) or not isinstance(steps, int):
        return ""
    draft, target = counts.get("draft_forward"), counts.get("target_forward")
    if not isinstance(draft, Mapping) or not isinstance(target, Mapping):
        return ""
    ph = per_phase({k: int(v) for k, v in draft.items()}, {k: int(v) for k, v in target.items()}, steps)
    parts = ", ".join(f"{p} {c.get('all_reduce', 0)} all-reduce + {c.get('all_gather', 0)} all-gather"
                      for p, c in ph.items())
    return f"collectives per iteration at steps {steps} (computed from the module trees): {parts}"
