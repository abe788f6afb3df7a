"""Plain-text readouts of a tuning result, from its JSON (the `tuning_finished` event's data).

Used by the headless `tune` command and usable by the report, which reads only the recording:
everything here works from JSON-shaped dicts, never from live objects. Formatting only.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

from tuner.core import setting as vocab


def label(s: Mapping[str, Any]) -> str:
    """`steps 3 topk 1 draft 4 sharded` (the TUI header's words, spaced for a table)."""
    return vocab.words(s, sep=" ") if s else vocab.TIER0_WORDS


def _num(v: Any, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def table(result: Mapping[str, Any], limit: int | None = None) -> list[str]:
    """Settings ranked by predicted tok/s, with the measured figure where there is one: at the
    prediction's batch size when measured there, else over every batch size the setting ran at."""
    measured = {vocab.key_of(m): m["tok_s"] for m in result.get("measured_tok_s", [])}
    for p in result.get("predictions", []):
        if p.get("measured_tok_s") is not None:
            measured[vocab.key_of(p)] = p["measured_tok_s"]
    best = result.get("best", {})
    rows = sorted(result.get("predictions", []),
                  key=lambda p: -(p["tok_s"] if p["tok_s"] is not None else -1))
    out = [f"  {'setting':<34} {'predicted tok/s':>17} {'measured':>9}  {'tau':>5}  basis"]
    for p in rows[:limit] if limit else rows:
        key = vocab.key_of(p)
        mark = "*" if best and key == vocab.key_of(best) else " "
        if p["tok_s"] is None:
            out.append(f"{mark} {label(p):<34} {'—':>17} {_num(measured.get(key)):>9}  {'':>5}  {p['reason']}")
            continue
        pred = f"{p['tok_s']:.1f} ± {p['sd']:.1f}"
        out.append(f"{mark} {label(p):<34} {pred:>17} {_num(measured.get(key)):>9}  "
                   f"{_num(p['tau'], '.2f'):>5}  {p['basis']}")
    return out


def costs(model: Mapping[str, Any], bs: int) -> list[str]:
    """The fitted terms of each placement at this batch size, in ms, with standard errors."""
    out = []
    for g in model.get("groups", []):
        if g["bs"] != bs or not g["terms"]:
            continue

        def c(term: str, name: str) -> str:
            v = g["terms"][term]["coef"].get(name)
            return "n/a" if v is None else f"{v['value']:.3f} ± {v['se']:.3f}"
        comm = g["comm"]["draft"]["coef"].get("s-1")
        out.append(f"  {g['placement']} (bs {bs}): draft step {c('draft', 's-1')} ms"
                   + (f" (collectives {comm['value']:.3f})" if comm else "")
                   + f"; verify {c('verify', '1')} + {c('verify', 'N')}·N ms"
                   + f"; extend {c('draft_extend', '1')} + {c('draft_extend', 'N')}·N ms"
                   + f"; sample+sched {c('verify_sample', '1')} + {c('sched', '1')} ms"
                   # A model saved before prefill was its own term has none (it is inside sched).
                   + (f"; prefill {c('prefill', '1')} ms" if "prefill" in g["terms"] else ""))
    acc = model.get("acceptance", {})
    if acc.get("p"):
        taus = ", ".join(f"{s}:{v[0]:.2f}" for s, v in acc["tau_chain"].items())
        out.append("  acceptance p_k: " + " ".join(f"{p:.2f}" for p in acc["p"]) + f"   tau(steps) {taus}")
    return out


_OLD_STOP = re.compile(r"(predicted|measured) gain ([-+][\d.]+) % is within noise( \[[^\]]*\])?")


def stop_words(reason: str) -> str:
    """Why the tuner stopped, in the words of the candidate it did not try: "next candidate
    predicted -3.9 %, within noise" (recordings made before say "predicted gain -3.9 % is within
    noise", which read as the tuning's own result)."""
    m = _OLD_STOP.fullmatch(reason or "")
    if m:
        return f"next candidate {m.group(1)} {m.group(2)} %{m.group(3) or ''}, within noise"
    return reason or "?"


def _chain(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The verified A/Bs from the starting setting to the best, in order (each won against the
    one before); [] when the best is the starting setting or the chain is broken."""
    key = vocab.key_of
    wins = {key(v["setting"]): v for v in result.get("verifications") or [] if isinstance(v, Mapping)
            and v.get("verdict") == "better" and isinstance(v.get("setting"), Mapping)
            and isinstance(v.get("ratio"), (int, float))}
    out: list[Mapping[str, Any]] = []
    at = result.get("best") if isinstance(result.get("best"), Mapping) else {}
    start = result.get("initial") if isinstance(result.get("initial"), Mapping) else {}
    while at and key(at) != key(start) and key(at) in wins and len(out) < 32:
        v = wins[key(at)]
        out.insert(0, v)
        at = v.get("incumbent") if isinstance(v.get("incumbent"), Mapping) else {}
    return out if at and key(at) == key(start) else []


def result_line(result: Mapping[str, Any]) -> str:
    """The tuning's outcome in one line: `best steps 3 … rank0: +46 % vs start (A/B) · stopped: next
    candidate predicted -14.7 %, within noise` (the tune screen, `tune`'s first and last line)."""
    # A recording is data: whatever it holds reads as "?" rather than a traceback.
    best, start = (result.get(k) if isinstance(result.get(k), Mapping) else {} for k in ("best", "initial"))
    head = f"best {label(best)}" if best else "best ?"
    if not best:
        pass
    elif vocab.key_of(best) == vocab.key_of(start):
        head += ": the starting setting (nothing verified better)"
    else:
        chain = _chain(result)
        ratio = math.prod(v["ratio"] for v in chain) if chain else math.nan
        if len(chain) == 1:
            head += f": {(ratio - 1) * 100:+.0f} % vs start (A/B)"
        elif chain:
            head += f": {(ratio - 1) * 100:+.0f} % vs start ({len(chain)} A/Bs chained)"
        else:
            head += ": not verified against the start"
    return f"{head} · stopped: {stop_words(str(result.get('stop_reason', '')))}"


def summary(result: Mapping[str, Any]) -> list[str]:
    """The whole readout: choice, evidence (A/B), table, costs, comparisons, export."""
    lines = [result_line(result),
             f"started at {label(result['initial'])}; now applied: {label(result['applied'])}; "
             f"{result['elapsed_s']:.0f} s, {result['probes']} probes, {len(result['verifications'])} "
             f"A/B verification(s), bs {result['bs']}"]
    for lead in result.get("unverified_leads") or []:
        # Never a pick while a measured setting beats it beyond noise without saying so.
        lines.append(f"  note: {label(lead)} measured {(lead.get('ratio', 1) - 1) * 100:+.0f} % over the pick in "
                     "its probe and was never judged by an A/B (the budget ran out)")
    for v in result.get("verifications", []):
        pr = v.get("predicted_ratio")
        lines.append(f"  A/B {label(v['setting'])} vs {label(v['incumbent'])}: {v['verdict']}, measured "
                     f"{(v['ratio'] - 1) * 100:+.1f} % [{(v['lo'] - 1) * 100:+.1f}, {(v['hi'] - 1) * 100:+.1f}]"
                     + (f", predicted {(pr - 1) * 100:+.1f} %" if pr is not None else "")
                     + f" ({v['windows'][0]}+{v['windows'][1]} windows of {v['series']})")
    lines.append("predicted vs measured (* = chosen):")
    lines += table(result, limit=12)
    lines += objective_lines(result.get("objective"), result.get("best") or {})
    if result.get("model"):
        lines.append("fitted costs:")
        lines += costs(result["model"], result["bs"])
    ao = result.get("acceptance_only")
    if ao:
        lines.append(f"an acceptance-only policy (SGLang adaptive) would run {label(ao)}: predicted "
                     f"{_num(ao.get('predicted_tok_s'))} tok/s")
    w = result.get("what_if")
    if w:
        lines.append(f"what if the draft left the TP group ({w['to_placement']}): collectives are "
                     f"{w['comm_share'] * 100:.0f} % of draft time; predicted {w['tok_s']:.1f} tok/s "
                     f"(low {w['tok_s_low']:.1f}) vs {w['tok_s_now']:.1f} with it in the TP group")
    sg = result.get("sglang", {})
    if sg.get("note"):
        lines.append("note: " + sg["note"])
    if sg.get("setting") is not None:
        lines.append(f"SGLang launch flags ({label(sg['best'])}): "
                     + (" ".join(sg["setting"]) or "(none: speculation off)"))
    if sg.get("adaptive_config"):
        lines.append("SGLang per-batch-size steps: " + " ".join(sg.get("adaptive_flags", [])))
        lines.append("  tuned-adaptive.json: " + json.dumps(sg["adaptive_config"]))
    return lines


def objective_lines(obj: Mapping[str, Any] | None, best: Mapping[str, Any], table: bool = True) -> list[str]:
    """Under an objective (tuner.tuning.slo): each measured setting's predicted and measured latency
    and whether it met the SLO (`table`; the tune screen has them in its rows); when none did, the
    nearest, said so."""
    if not obj:
        return []
    slo = ",".join(obj.get("slo") or [])
    lines = [f"objective: {obj.get('kind')}" + (f", SLO {slo}" if slo else "")
             + (f" (judged: {', '.join(obj.get('judged') or [])})" if slo else "")]
    if table:
        lines.append(f"  {'setting':<34} {'tok/s':>7} {'pred. ITL':>16} {'measured':>28}  SLO")
    for r in obj.get("settings", []) if table else ():
        mark = "*" if best and vocab.key_of(r) == vocab.key_of(best) else " "
        pi, psd = r.get("predicted_itl"), r.get("predicted_itl_sd")
        pred = "-" if pi is None else f"{pi * 1e3:.1f} ± {(psd or 0) * 1e3:.1f} ms"
        figs = " ".join(f"{k} {v * 1e3:.1f}ms" for k, v in sorted((r.get("figures") or {}).items())
                        if isinstance(v, (int, float)) and math.isfinite(v))
        meets = {True: "meets", False: "misses", None: "unknown"}[r.get("meets")]
        lines.append(f"{mark} {label(r):<34} {_num(r.get('tok_s')):>7} {pred:>16} {figs:>28}  {meets}")
    near = obj.get("nearest")
    if obj.get("met") is False and near:
        lines.append(f"no setting measured meets the SLO {slo}; nearest: {label(near)} "
                     f"({_num(near.get('tok_s'))} tok/s)")
    return lines
