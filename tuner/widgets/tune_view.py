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
    itl: float = math.nan            # under an objective: predicted ITL (s) at its quantile
    itl_sd: float = math.nan
    itl_measured: float = math.nan   # measured, as the SLO is read (tuner.tuning.slo.windowed_itl)
    meets: bool | None = None        # whether its measured figures meet the SLO (None: unknown, no SLO)


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
    """Under --tune-objective latency / --tune-slo: what it judges and, when no setting met the
    SLO, the nearest (tuner.tuning.summary); each row's latency is in the row."""


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
    obj = doc.get("objective") or {}
    itl_name, latency = _latency_by_setting(obj)
    out = []
    for key, row in rows.items():
        marks = ("★" if key == best else "") + ("▶" if key == now else "")
        verdict = verdicts.get(key)
        marks += {"better": "✓", "worse": "✗", "same": "="}.get(verdict or "", "")
        note = row.note or (f"A/B: {verdict}" if verdict else "")
        lat = latency.get(key, {})
        out.append(TuneRow(row.key, row.setting, row.label, row.predicted, row.sd, row.tau,
                           row.measured, row.basis, note, marks, _f(lat.get("predicted_itl")),
                           _f(lat.get("predicted_itl_sd")), _f((lat.get("figures") or {}).get(itl_name)),
                           lat.get("meets") if obj.get("slo") else None))
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
    # The rows carry each setting's latency; the notes keep the objective and the nearest miss.
    objective = tuple(objective_lines(obj, doc.get("best") or {}, table=False)) or \
        ((f"objective: {doc['objective_text']}",) if doc.get("objective_text") else ())
    return TuneView(state, stage, status, progress, tuple(out), cost_lines,
                    tuple(verification_line(v) for v in doc.get("verifications") or ()), result, bs,
                    read_only, objective)


def _latency_by_setting(obj: Mapping[str, Any]) -> tuple[str, dict[tuple, dict]]:
    """(the ITL figure's name, setting key -> its predicted ITL, measured figures and verdict) of an
    objective report (tuner.tuning.live.Tuner.objective_report); ("", {}) without one."""
    if not obj:
        return "", {}
    out: dict[tuple, dict] = {}
    for r in [*(obj.get("predicted") or ()), *(obj.get("settings") or ())]:
        out.setdefault(vocab.key_of(r), {}).update(r)
    name = obj.get("itl")
    if not name:   # a recording made before the report named it: the figure the rows carry
        name = next((k for r in obj.get("settings") or () for k in (r.get("figures") or {})
                     if k.startswith("itl_")), "itl_p99")
    return name, out


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
            "objective_text": "" if tuner.opts.objective.plain else tuner.opts.objective.describe(),
            "objective": tuner.objective_report() if hasattr(tuner, "objective_report") else None}


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
