"""The report's "adaptive controller vs the tuned schedule" section, from a recording.

The newest `controller_check` event (tuner.tuning.controller_watch wrote it while recording) is the
table: per batch bucket the tier the server's controller ran, the tuner's best and the predicted
tok/s lost. A recording without one, of a server that ran `--speculative-adaptive`, falls back to
the recorded running-requests and steps series paired by time (tuner.tuning.controller_check's
gauges rule), labelled approximate, with no best. Pure over RecordingData; formats nothing.
"""

from __future__ import annotations

from typing import Any

from tuner.core import series as S
from tuner.core.records import thaw
from tuner.report.data import RecordingData
from tuner.tuning import controller_check as CC
from tuner.tuning.controller_watch import is_adaptive
from tuner.tuning.schedule import range_text

HEAD = ["batch", "iterations", "controller ran", "tuner's best", "stage", "predicted tok/s (ran)",
        "predicted tok/s (best)", "lost tok/s"]


def controller_of(data: RecordingData) -> dict[str, Any] | None:
    """The check's JSON (controller_check's shape), or None when the server ran no controller."""
    events = data.events(CC.EVENT_KIND)
    if events:
        return thaw(events[-1].data)
    if not is_adaptive(data.server_info()):
        return None
    running, steps = data.get(S.SERVER_RUNNING), data.get(S.SPEC_NUM_STEPS)
    pairs = CC.pairs_from_gauges(list(zip(running.t, running.v)), list(zip(steps.t, steps.v)))
    if not pairs:
        return None
    return CC.check(CC.chosen_tiers(pairs), None, CC.GAUGES)


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    def n(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}"

    out = []
    for r in doc.get("rows", []):
        rng = range_text(r["bs_lo"], r.get("bs_hi"))
        ran = "n/a" if r.get("chosen_steps") is None else \
            f"steps {r['chosen_steps']} ({(r.get('chosen_share') or 0) * 100:.0f} %)"
        best = "n/a" if r.get("best_steps") is None else f"steps {r['best_steps']}"
        lost = "n/a" if r.get("loss_tok_s") is None else f"{r['loss_tok_s']:.1f} ({r.get('loss_pct') or 0:.0f} %)"
        out.append([rng, str(r.get("iterations", 0)), ran, best, str(r.get("stage", "")),
                    n(r.get("chosen_tok_s")), n(r.get("best_tok_s")), lost])
    return out


def caption(doc: dict[str, Any]) -> str:
    src = {CC.RECORDS: "the phase records' batch size and steps", CC.GAUGES: "sampled gauges",
           CC.LOG: "SGLang's log lines"}.get(doc.get("source"), str(doc.get("source")))
    cost = CC.overall_text(doc, long=True)
    cost = f"The controller's tiers against the tuner's best: {cost}. " if cost else ""
    return f"Tier from {src}. {cost}{doc.get('note', '')}".strip()
