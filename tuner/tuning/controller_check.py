"""The engine's own adaptive controller, checked: per batch bucket, the tier it chose and the tuner's
best, with the predicted cost of the difference (tok/s lost).

Where the chosen tier comes from (each feeds `chosen_tiers` with (batch size, steps) pairs):
- the phase records' (`bs`, `steps`) of adaptive iterations, on our engine and on SGLang with our
  plugin (exact: source "records");
- SGLang without the plugin: `sglang:spec_num_steps` sampled against `sglang:num_running_reqs`
  (`pairs_from_gauges`; approximate: the gauges are read at poll times, not per iteration);
- managed mode: SGLang's own log lines, parsed elsewhere into the same pairs (source "log").
The tuner's best per bucket is tuner.tuning.schedule's per-bucket fit over the iterations seen so far,
over the tiers the controller can choose (chains on the server's placement, tier 0 included).

The result's JSON is the data of the `controller_check` event (the TUI's acceptance panel and the
report read it back):

    {"source": "records" | "gauges" | "log", "approximate": bool, "placement": "sharded",
     "rows": [{"bucket": "1", "bs_lo": 1, "bs_hi": 1, "iterations": 812,
               "chosen_steps": 5, "chosen_share": 0.93, "tiers": {"5": 755, "3": 57},
               "best_steps": 3 | null,
               "stage": "measured" | "predicted-only" | "too little data" | "no fit" | "one tier measured",
               "chosen_tok_s": 80.1 | null, "best_tok_s": 86.0 | null,
               "loss_tok_s": 5.9 | null, "loss_pct": 6.9 | null}, ...],
     "overall": {"loss_pct": 2.4, "weighted_by": "time" | "iterations" | "samples" | "log lines",
                 "buckets": 2} | null,
     "note": "..."}

`overall` is the traffic's whole cost: 100 × (1 − the weighted mean over buckets of the tier it ran
÷ the tuner's best, predicted), each bucket weighted by the time the controller ran there (phase
records) or by its share of samples (gauges, polled evenly in time) or of log lines. Null when no
bucket has both figures.

Pure: nothing here measures, polls or talks to a server.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from probes.names import SHARDED
from tuner.core.events import EventKind
from tuner.tuning.observations import Iteration
from tuner.tuning.schedule import (
    TOO_LITTLE, BucketRow, Schedule, bucket_bounds, bucket_lo, fit_schedule, range_text, time_by_bucket,
)
from tuner.tuning.settings import Setting

RECORDS, GAUGES, LOG = "records", "gauges", "log"
NO_FIT = "no fit"
ONE_TIER = "one tier measured"
EVENT_KIND = EventKind.CONTROLLER_CHECK


@dataclass(frozen=True)
class ChosenTier:
    """What the controller ran in one batch bucket: its most frequent tier and the counts of all."""

    lo: int
    steps: int
    share: float
    n: int
    tiers: Mapping[int, int]


def chosen_tiers(pairs: Iterable[tuple[int, int]]) -> dict[int, ChosenTier]:
    """(batch size, steps) per iteration (or per sample) → per batch bucket (keyed by its lo)."""
    counts: dict[int, dict[int, int]] = {}
    for bs, steps in pairs:
        if bs < 1 or steps < 0:
            continue
        c = counts.setdefault(bucket_lo(bs), {})
        c[steps] = c.get(steps, 0) + 1
    out = {}
    for lo, c in counts.items():
        n = sum(c.values())
        steps = max(c, key=lambda s: (c[s], -s))
        out[lo] = ChosenTier(lo, steps, c[steps] / n, n, dict(sorted(c.items())))
    return out


def pairs_from_gauges(running: Sequence[tuple[float, float]], steps: Sequence[tuple[float, float]],
                      max_age_s: float = 5.0) -> list[tuple[int, int]]:
    """(batch size, steps) from two gauge series of (t, value): each steps reading paired with the
    newest running-requests reading at or before it (no older than max_age_s). Readings with no
    running request (an idle server runs no tier) or no finite value are left out."""
    ts = [t for t, _ in running]
    out = []
    for t, s in steps:
        i = bisect_right(ts, t) - 1
        if i < 0 or t - ts[i] > max_age_s:
            continue
        r = running[i][1]
        if not (math.isfinite(r) and math.isfinite(s)) or r < 1 or s < 0:
            continue
        out.append((int(round(r)), int(round(s))))
    return out


def tier(steps: int, placement: str = SHARDED) -> Setting:
    """The setting an adaptive tier runs (a chain; tier 0 is speculation off)."""
    return Setting(0) if steps == 0 else Setting(steps, 1, steps + 1, placement)


def tier_space(max_steps: int, placement: str = SHARDED) -> list[Setting]:
    return [tier(s, placement) for s in range(0, max_steps + 1)]


@dataclass(frozen=True)
class CheckRow:
    lo: int
    hi: int | None
    chosen: ChosenTier | None
    best: Setting | None
    stage: str
    chosen_tok_s: float | None
    best_tok_s: float | None

    @property
    def loss_tok_s(self) -> float | None:
        if self.chosen_tok_s is None or self.best_tok_s is None:
            return None
        return max(self.best_tok_s - self.chosen_tok_s, 0.0)

    @property
    def loss_pct(self) -> float | None:
        loss = self.loss_tok_s
        return None if loss is None or not self.best_tok_s else 100.0 * loss / self.best_tok_s

    def to_json(self) -> dict[str, Any]:
        c = self.chosen
        return {"bucket": str(self.lo), "bs_lo": self.lo, "bs_hi": self.hi,
                "iterations": c.n if c else 0,
                "chosen_steps": c.steps if c else None,
                "chosen_share": round(c.share, 4) if c else None,
                "tiers": {str(k): v for k, v in c.tiers.items()} if c else {},
                "best_steps": self.best.steps if self.best is not None else None,
                "stage": self.stage,
                "chosen_tok_s": _num(self.chosen_tok_s), "best_tok_s": _num(self.best_tok_s),
                "loss_tok_s": _num(self.loss_tok_s), "loss_pct": _num(self.loss_pct)}


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 3)


def _predicted(row: BucketRow | None, schedule: Schedule | None, s: Setting) -> float | None:
    if row is None or schedule is None:
        return None
    p = row.predict(schedule.model, s)
    return p.tok_s if p is not None else None


def _predictable_tiers(row: BucketRow, schedule: Schedule, placement: str) -> int:
    """Chain depths the fit predicts at the bucket's batch size (tier 0, always extrapolable, aside)."""
    model = schedule.model
    if model is None or row.bs is None:
        return 0
    deepest = max((st.setting.steps for st in model.stats), default=0)
    return sum(1 for s in range(1, deepest + 1)
               if (p := row.predict(model, tier(s, placement))) is not None and p.tok_s is not None)


def overall(rows: Sequence[CheckRow], time_ms: Mapping[int, float] | None, source: str) -> dict[str, Any] | None:
    """The controller's cost over the whole traffic (see the module docstring); time_ms: bucket lo →
    the time the controller ran there, else each bucket's count of iterations, samples or lines."""
    parts = []
    for r in rows:
        if r.chosen is None or r.chosen_tok_s is None or not r.best_tok_s:
            continue
        w = time_ms.get(r.lo, 0.0) if time_ms is not None else float(r.chosen.n)
        if w > 0:
            parts.append((w, min(r.chosen_tok_s / r.best_tok_s, 1.0)))
    if not parts:
        return None
    total = sum(w for w, _ in parts)
    kept = sum(w * x for w, x in parts) / total
    weighted_by = "time" if time_ms is not None else {GAUGES: "samples", LOG: "log lines"}.get(source, "iterations")
    return {"loss_pct": round(100.0 * (1.0 - kept), 3), "weighted_by": weighted_by, "buckets": len(parts)}


def check(chosen: Mapping[int, ChosenTier], schedule: Schedule | None, source: str,
          placement: str = SHARDED, time_ms: Mapping[int, float] | None = None) -> dict[str, Any]:
    """The check's JSON (see the module docstring) from the chosen tiers and the per-bucket fit
    (None when no phase costs exist: the rows then say what ran, with no best). time_ms weights
    `overall` by the time the controller ran in each bucket (default: its counts)."""
    approximate = source == GAUGES
    rows = []
    for lo in sorted(chosen):
        c = chosen[lo]
        _, hi = bucket_bounds(lo)
        row = schedule.row(lo) if schedule is not None else None
        if schedule is None:
            rows.append(CheckRow(lo, hi, c, None, NO_FIT, None, None))
            continue
        if row is None or row.best is None:
            rows.append(CheckRow(lo, hi, c, None, TOO_LITTLE, _predicted(row, schedule, tier(c.steps, placement)),
                                 None))
            continue
        chosen_tok = _predicted(row, schedule, tier(c.steps, placement))
        if _predictable_tiers(row, schedule, placement) < 2:
            # The fit knows one chain depth here (the tier the controller ran): any other is unknown,
            # so "the best" would only be the tier it ran.
            rows.append(CheckRow(lo, hi, c, None, ONE_TIER, chosen_tok, None))
            continue
        rows.append(CheckRow(lo, hi, c, row.best.setting, row.stage, chosen_tok, row.best.tok_s))
    if schedule is None:
        note = "No phase costs (no per-iteration phase stream): the tier the controller ran, without the tuner's best."
    else:
        note = ("Lost tok/s: the tuner's predicted tok/s at the bucket's batch size, its best tier minus the "
                "tier the controller ran most.")
    if approximate:
        note = ("Approximate: sglang:spec_num_steps sampled against sglang:num_running_reqs at poll times. "
                + note)
    return {"source": source, "approximate": approximate, "placement": placement,
            "rows": [r.to_json() for r in rows], "overall": overall(rows, time_ms, source), "note": note}


def check_from_iterations(iters: Sequence[Iteration], max_steps: int | None = None) -> dict[str, Any] | None:
    """The check over phase-stream iterations (settled ones for the fit): tiers from the adaptive
    records, the best from every iteration's costs. None when no iteration ran adaptive."""
    adaptive = [(it.bs, it.setting.steps) for it in iters if it.adaptive]
    if not adaptive:
        return None
    placements = [it.setting.placement for it in iters if it.adaptive and it.setting.steps > 0]
    placement = max(set(placements), key=placements.count) if placements else SHARDED
    deepest = max((it.setting.steps for it in iters), default=1)
    space = tier_space(max(max_steps or 0, deepest), placement)
    schedule = fit_schedule(iters, space)
    return check(chosen_tiers(adaptive), schedule, RECORDS, placement,
                 time_by_bucket(it for it in iters if it.adaptive))


def check_from_pairs(pairs: Iterable[tuple[int, int]], source: str, iters: Sequence[Iteration] = (),
                     max_steps: int | None = None, placement: str = SHARDED) -> dict[str, Any] | None:
    """The check from (batch size, steps) pairs of another source (SGLang's log lines in managed
    mode: source LOG; sampled gauges: GAUGES), with the per-bucket fit over `iters` when there are
    any (settled phase-stream iterations). None without a pair."""
    chosen = chosen_tiers(pairs)
    if not chosen:
        return None
    schedule = None
    if iters:
        deepest = max([it.setting.steps for it in iters] + [c.steps for c in chosen.values()])
        schedule = fit_schedule(iters, tier_space(max(max_steps or 0, deepest), placement))
    return check(chosen, schedule, source, placement)


def overall_text(doc: Mapping[str, Any], long: bool = False) -> str:
    """The whole-traffic cost in a few words ("" without one): short for the TUI panel's title, long
    (with its weighting) for the report's caption."""
    o = doc.get("overall")
    if not o:
        return ""
    text = "on the tuned best overall" if o["loss_pct"] < 0.05 else f"−{o['loss_pct']:.1f} % overall"
    if long:
        text += (f" (predicted, {o['buckets']} batch bucket{'s' if o['buckets'] != 1 else ''} weighted by "
                 f"{o['weighted_by']})")
    return text


def lines(doc: Mapping[str, Any]) -> list[str]:
    """The check as short text lines (the TUI panel and `tune`'s readout): one per bucket."""
    out = []
    for r in doc.get("rows", []):
        rng = range_text(r["bs_lo"], r.get("bs_hi"), space="")
        ran = "—" if r.get("chosen_steps") is None else f"s{r['chosen_steps']} ({(r.get('chosen_share') or 0) * 100:.0f}%)"
        if r.get("best_steps") is None:
            tail = r.get("stage", "")
        else:
            loss = r.get("loss_tok_s")
            pct = r.get("loss_pct")
            tail = (f"best s{r['best_steps']}  "
                    + ("—" if loss is None else f"−{loss:.1f} tok/s ({pct:.0f}%)" if loss > 0 else "on the best"))
        out.append(f"batch {rng:<6} ran {ran:<10} {tail}")
    return out
