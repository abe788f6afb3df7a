"""The main screen's "what if the draft left the TP group" readout, from the session's store.

The store holds the phase stream as per-poll means (`phase/<p>_ms`, `phase/<p>_comm_ms`,
`phase/wall_ms`, `spec/accept_pos/<k>`, `spec/verifies`, `server/batch_size`). This module turns the
readings of the active setting (after its settling time) into one `SettingStats`, fits the cost
model on that single point and asks its `what_if` (tuner.tuning.cost_model) what tok/s would be with
the draft's collectives removed. So the TUI and the tuner answer the question with one formula.
It answers per placement: rank0 runs the draft on rank 0 alone, replicated runs the whole draft on
every rank, which a server whose ranks share CPU cores pays in full (not predicted there).

Pure: reads a Store, never a server; never imports textual. Anything it cannot answer is a readout
with `reason` set ("n/a" and why), never an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from probes.names import DRAFT, DRAFT_EXTEND, PREFILL, RANK0, REPLICATED, SHARDED, VERIFY, VERIFY_SAMPLE
from tuner.core import timeline
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.store import Store
from tuner.tuning.cost_model import fit_cost_model
from tuner.tuning.observations import SettingStats, mean_se
from tuner.tuning.settings import Setting

WINDOW_S = 10.0
MIN_READINGS = 4          # per-poll means: at ~4 Hz, one second of the settled setting
OFF_GROUP = "replicated / rank0"
REPLICATED_COST = "pays the whole draft's compute on every rank"
SHARED_CORES = "on shared CPU cores"


@dataclass(frozen=True)
class PlacementWhatIf:
    """One placement's prediction: tok/s from the draft's compute unchanged (high) to × TP (low),
    or NaN with `note` saying why it is not predicted."""

    placement: str
    tok_s_low: float = math.nan
    tok_s: float = math.nan
    note: str = ""
    """What this placement costs that the range does not show (replicated: every rank drafts)."""


@dataclass(frozen=True)
class WhatIfReadout:
    """tok/s now vs predicted with the draft off the TP group; `reason` says why not when n/a."""

    reason: str = ""
    placement: str = OFF_GROUP
    comm_share: float = math.nan     # collective share of draft + draft_extend time
    tok_s_now: float = math.nan      # the model's tok/s at the active setting (its check on itself)
    tok_s: float = math.nan          # draft compute unchanged (latency-bound small layer)
    tok_s_low: float = math.nan      # draft compute × TP size (the whole layer on one rank)
    assumption: str = ""
    placements: tuple[PlacementWhatIf, ...] = ()
    """One prediction per placement off the group: rank0 (the draft on rank 0, the others wait),
    then replicated (the whole draft on every rank: the same range where each rank has its own
    device, none where the ranks share CPU cores)."""

    @property
    def available(self) -> bool:
        return not self.reason

    def gain(self) -> tuple[float, float]:
        """(low, high) predicted change as ratios (1.10 = +10 %)."""
        if not (self.tok_s_now > 0):
            return math.nan, math.nan
        return self.tok_s_low / self.tok_s_now, self.tok_s / self.tok_s_now


def active_setting(active: Mapping[str, Any]) -> Setting | None:
    """The Setting of an active-config dict (server-arg names), None when incomplete or invalid."""
    return Setting.from_args(active)


def _values(store: Store, series: str, t0: float, t1: float) -> list[float]:
    return [v for v in store.window(series, t0, t1).v if not math.isnan(v)]


def _histogram(p: list[float], verifies: float) -> tuple[int, ...]:
    """h[j] (rounds that accepted exactly j drafts) back from unconditional p_k and a round count:
    p_k = Σ_{j≥k} h[j] / Σ h, so h[j] = V·(p_j − p_{j+1}) with p_0 = 1."""
    ps = [1.0] + [min(max(x, 0.0), 1.0) for x in p] + [0.0]
    return tuple(max(0, round(verifies * (ps[j] - ps[j + 1]))) for j in range(len(ps) - 1))


SGLANG_GRAPHS = ("SGLang 0.5.23 cannot move the draft off the TP group, and its collectives run inside "
                 "CUDA graphs: c times them and predicts the PCIe-IPC all-reduce relaunch it does allow")


def what_if_now(store: Store, t_end: float, active: Mapping[str, Any], tp_size: int | None,
                window_s: float = WINDOW_S, has_phases: bool = True, device: str | None = None,
                kind: str | None = None) -> WhatIfReadout:
    """The readout for the active setting over the last `window_s` seconds of settled readings.

    has_phases: False when the source has no phase timers at all (the reason then says so).
    device: the server's device ("cpu": its ranks share the host's cores, so replicated, which runs
    the whole draft on every rank, is not predicted). kind: the server kind ("sglang": placement is
    no setting there, and the capture analysis says what is, tuner.tuning.comm_whatif)."""
    setting = active_setting(active)
    if not has_phases:
        return WhatIfReadout("no phase stream: the server reports no per-phase collective times")
    if setting is None:
        return WhatIfReadout("the server has not reported its setting yet")
    if setting.steps == 0:
        return WhatIfReadout("tier 0 (draft kept warm): nothing is drafted to move")
    if setting.placement != SHARDED:
        return WhatIfReadout(f"the draft already runs off the TP group ({setting.placement})")
    if tp_size is not None and tp_size < 2:
        return WhatIfReadout("TP size 1: there is no TP group to leave")
    t0 = t_end - window_s
    change = store.last_event(EventKind.CONFIG_CHANGED, at=t_end)
    if change is not None:
        # Readings from before the active setting settled describe another setting.
        t0 = max(t0, timeline.settle_end(store, change.t))
    draft = _values(store, S.phase_ms("draft"), t0, t_end)
    if len(draft) < MIN_READINGS:
        return WhatIfReadout("waiting for settled decode iterations of this setting")
    if not _values(store, S.phase_comm_ms("draft"), t0, t_end):
        # Absent means "not measurable" (collectives inside CUDA graphs), never 0: a prediction
        # with them at 0 would say that leaving the group only costs.
        if kind == "sglang":
            return WhatIfReadout(SGLANG_GRAPHS)
        return WhatIfReadout("the draft's collectives run inside CUDA graphs, untimed here: "
                             "c times them in a trace, p tries it")

    def ms(series: str) -> tuple[float, float]:
        m, se = mean_se(_values(store, series, t0, t_end))
        return (m, se) if not math.isnan(m) else (0.0, 0.0)

    # Prefill absent (an older recording, SGLang's plugin) reads 0 and stays in sched.
    terms = {p: ms(S.phase_ms(p)) for p in (DRAFT, DRAFT_EXTEND, VERIFY, VERIFY_SAMPLE, PREFILL)}
    wall = ms(S.PHASE_WALL_MS)
    if not wall[0] > 0:
        return WhatIfReadout("waiting for settled decode iterations of this setting")
    work = sum(m for m, _ in terms.values())
    terms["sched"] = (max(wall[0] - work, 0.0), wall[1])
    comm = {p: ms(S.phase_comm_ms(p)) for p in (DRAFT, DRAFT_EXTEND, VERIFY, VERIFY_SAMPLE)}
    p = [pk for k in range(1, setting.steps + 1)
         if not math.isnan(pk := _mean(_values(store, S.accept_pos(k), t0, t_end)))]
    verifies = sum(_values(store, S.SPEC_VERIFIES, t0, t_end))
    if len(p) < setting.steps or not verifies > 0:
        return WhatIfReadout("waiting for acceptance readings of this setting")
    batch = _mean(_values(store, S.SERVER_BATCH, t0, t_end))
    bs = max(1, round(batch)) if batch > 0 else 1
    stats = SettingStats(setting, bs, len(draft), terms, comm, {}, wall, math.nan,
                         _histogram(p, verifies))
    model = fit_cost_model([stats], tp_size)
    w = model.what_if(setting, bs, REPLICATED)
    if w is None:
        return WhatIfReadout("the cost model could not use these readings")
    # Without per-phase collective counts in the store, the one broadcast the draft keeps off the
    # group is not charged: the prediction is the draft's collectives removed entirely.
    rank0 = PlacementWhatIf(RANK0, w.tok_s_low, w.tok_s)
    if device == "cpu":
        replicated = PlacementWhatIf(REPLICATED, note=f"{REPLICATED_COST}, {SHARED_CORES}")
    else:
        # Each rank drafts on its own device: the critical path is rank 0's, as under rank0.
        replicated = PlacementWhatIf(REPLICATED, w.tok_s_low, w.tok_s, REPLICATED_COST)
    return WhatIfReadout("", OFF_GROUP, w.comm_share, w.tok_s_now, w.tok_s, w.tok_s_low,
                         w.assumption.replace("one broadcast of draft tokens kept", "all of them"),
                         (rank0, replicated))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
