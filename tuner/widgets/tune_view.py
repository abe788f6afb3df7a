"""What the tune screen draws, as one frozen view built from JSON-shaped tuning data.

A live `tuner.tuning.live.Tuner` and a replayed recording's `tuning_*` events both become a
result-shaped dict (the `TuningResult.to_json()` keys: predictions, measured_tok_s, verifications,
model, best, applied, bs, stop_reason), so one screen draws both and agrees with `tune` and the
report. Formatting and selection only: no fitting, no measuring, no server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from tuner.core import setting as vocab
from tuner.core.events import TUNING_KINDS, TuningKind  # noqa: F401  (TUNING_KINDS re-exported for the app)
from tuner.core.records import Event, thaw
from tuner.tuning.summary import costs, label, objective_lines, result_line


@dataclass(frozen=True)
class TuneRow:
    key: tuple                       # vocab.key_of the setting
    setting: Mapping[str, Any]       # setting dict (to apply it)
    label: str
    predicted: float = math.nan
    sd: float = math.nan
    tau: float = math.nan
    measured: float = math.nan
    basis: str = ""                  # measured | fitted | extrapolated | what-if | "" (not predicted)
    note: str = ""                   # why it is not predicted, or the A/B verdict
    marks: str = ""                  # ★ best, ▶ running now, ✓ verified better, ✗ rolled back


@dataclass(frozen=True)
class TuneView:
    state: str = "idle"              # idle | running | done | failed | recorded
    stage: str = ""
    status: str = ""
    progress: float = 0.0
    rows: tuple[TuneRow, ...] = ()
    costs: tuple[str, ...] = ()
    verifications: tuple[str, ...] = ()
    result: str = ""                 # one line once finished
    bs: int | None = None
    read_only: bool = False
    objective: tuple[str, ...] = ()
    """Under --tune-objective latency / --tune-slo: what it judges; once finished, each measured
    setting's predicted and measured latency and whether it met the SLO (tuner.tuning.summary)."""


def _f(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def verification_line(v: Mapping[str, Any]) -> str:
    pr = v.get("predicted_ratio")
    pred = f", predicted {(pr - 1) * 100:+.1f}%" if isinstance(pr, (int, float)) and math.isfinite(pr) else ""
    return (f"{vocab.compact(v['setting'])} vs {vocab.compact(v['incumbent'])}: {v['verdict']}, "
            f"{(v['ratio'] - 1) * 100:+.1f}% [{(v['lo'] - 1) * 100:+.1f}, {(v['hi'] - 1) * 100:+.1f}]{pred}")


def same_batch_measured(p: Mapping[str, Any], any_batch: float | None) -> float:
    """A prediction's measured figure: at its own batch size when that was measured (the same
    quantity the model predicts), else over every batch size the setting ran at. A probe on a
    server whose batch came and went mixes batch sizes; next to a batch-2 prediction that mix
    reads as a model error it is not."""
    own = _f(p.get("measured_tok_s"))
    if not math.isnan(own):
        return own
    return _f(any_batch) if any_batch is not None else math.nan


def build_view(doc: Mapping[str, Any], *, state: str, stage: str = "", status: str = "",
               progress: float = 0.0, current: Mapping[str, Any] | None = None,
               space: Iterable[Mapping[str, Any]] = (), read_only: bool = False) -> TuneView:
    """The view of a result-shaped dict; `space` adds settings not predicted yet (while probing)."""
    measured = {vocab.key_of(m): _f(m.get("tok_s")) for m in doc.get("measured_tok_s") or ()}
    verdicts: dict[tuple, str] = {}
    for v in doc.get("verifications") or ():
        verdicts[vocab.key_of(v["setting"])] = v["verdict"]
    best = vocab.key_of(doc["best"]) if doc.get("best") else None
    now = vocab.key_of(current) if current else None
    rows: dict[tuple, TuneRow] = {}
    for p in doc.get("predictions") or ():
        key = vocab.key_of(p)
        rows[key] = TuneRow(key, _setting(p), vocab.compact(p), _f(p.get("tok_s")), _f(p.get("sd")),
                            _f(p.get("tau")), same_batch_measured(p, measured.get(key)),
                            p.get("basis", "") if p.get("tok_s") is not None else "",
                            "" if p.get("tok_s") is not None else str(p.get("reason", "")))
    for s in space:
        key = vocab.key_of(s)
        if key not in rows:
            rows[key] = TuneRow(key, _setting(s), vocab.compact(s), measured=measured.get(key, math.nan),
                                note="not predicted yet")
    for key, tok in measured.items():
        if key not in rows:
            d = vocab.from_key(key)
            rows[key] = TuneRow(key, d, vocab.compact(d), measured=tok)
    out = []
    for key, row in rows.items():
        marks = ("★" if key == best else "") + ("▶" if key == now else "")
        verdict = verdicts.get(key)
        marks += {"better": "✓", "worse": "✗", "same": "="}.get(verdict or "", "")
        note = row.note or (f"A/B: {verdict}" if verdict else "")
        out.append(TuneRow(row.key, row.setting, row.label, row.predicted, row.sd, row.tau,
                           row.measured, row.basis, note, marks))
    # Best predicted first; settings with no prediction after, by what was measured.
    out.sort(key=lambda r: (math.isnan(r.predicted), -(r.predicted if not math.isnan(r.predicted)
                                                        else (r.measured if not math.isnan(r.measured) else 0))))
    bs = doc.get("bs") if isinstance(doc.get("bs"), int) else None
    cost_lines = tuple(line.strip() for line in costs(doc["model"], bs)) if doc.get("model") and bs else ()
    result = ""
    if doc.get("stop_reason") and doc.get("best"):
        # What the server runs now (`current`, as it reports it) once the operator applied another
        # row with enter; the result's own `applied` only for a recording.
        result = f"{result_line(doc)}; the server runs {label(current or doc.get('applied') or doc['best'])}"
    objective = tuple(objective_lines(doc.get("objective"), doc.get("best") or {})) or \
        ((f"objective: {doc['objective_text']}",) if doc.get("objective_text") else ())
    return TuneView(state, stage, status, progress, tuple(out), cost_lines,
                    tuple(verification_line(v) for v in doc.get("verifications") or ()), result, bs,
                    read_only, objective)


def _setting(d: Mapping[str, Any]) -> dict:
    """A setting's JSON: the knobs it has (one it lacks is left out, as in Setting.to_json)."""
    return {k.key: d[k.key] for k in vocab.knobs() if d.get(k.key) is not None}


def live_doc(tuner: Any, model_json: Mapping[str, Any] | None) -> dict:
    """A result-shaped dict of a running (or finished) Tuner's public surface."""
    if tuner.result is not None:
        return tuner.result.to_json()
    preds = list(tuner.predictions)
    bs = preds[0].bs if preds else None
    top = max((p for p in preds if p.tok_s is not None), key=lambda p: p.tok_s, default=None)
    return {"predictions": [p.to_json() for p in preds],
            "measured_tok_s": [{**s.to_json(), "tok_s": v} for s, v in tuner.measured.items()],
            "verifications": [v.to_json() for v in tuner.verifications],
            "model": model_json, "bs": bs, "best": top.setting.to_json() if top else None,
            "objective_text": "" if tuner.opts.objective.plain else tuner.opts.objective.describe()}


def recorded_doc(events: Iterable[Event]) -> tuple[dict, str] | None:
    """The newest tuning in a recording's events as (result-shaped dict, state), None without one.

    A finished tuning is its `tuning_finished` result; one the recording cut short is rebuilt from
    its last prediction, probes and verifications."""
    evs = [e for e in events if e.kind in TUNING_KINDS]
    starts = [i for i, e in enumerate(evs) if e.kind == TuningKind.STARTED]
    if starts:
        evs = evs[starts[-1]:]
    if not evs:
        return None
    for e in reversed(evs):
        if e.kind == TuningKind.FINISHED:
            return thaw(e.data), "done"
    doc: dict = {"predictions": [], "measured_tok_s": [], "verifications": [], "model": None}
    sums: dict[tuple, tuple[dict, float]] = {}
    for e in evs:
        d = thaw(e.data)
        if e.kind == TuningKind.PREDICTION:
            doc.update(predictions=d.get("predictions") or [], model=d.get("model"), bs=d.get("bs"),
                       best=d.get("best"))
        elif e.kind == TuningKind.PROBE and isinstance(d.get("tok_s"), (int, float)):
            sums[vocab.key_of(d["setting"])] = (d["setting"], d["tok_s"])
        elif e.kind == TuningKind.VERIFIED:
            doc["verifications"].append(d)
    doc["measured_tok_s"] = [{**s, "tok_s": v} for s, v in sums.values()]
    return doc, "cut short"
