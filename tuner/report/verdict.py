"""The report's verdict: the fastest setting with enough settled windows, against the runner-up,
with its interval (tuner.core.windows) and the reasons in sentences ("why": tok/s = B * tau / T
decomposed into batch, accept length and iteration time, and the phases that moved).

Pure functions over the report's rows; must not import textual or read files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuner.core import series as S
from tuner.core import windows as W
from tuner.core.windows import MIN_WINDOWS
from tuner.report.rows import SettingRow, clean


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
        return clean({"best": self.best.label, "against": self.other.label if self.other else None,
                       "ratio": self.ratio, "ci95": [self.lo, self.hi], "why": self.sentences})



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
