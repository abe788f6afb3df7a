"""The Markdown report: the same verdict and tables as the HTML page, for a ticket or a PR comment.

Charts are left to the HTML report (Markdown cannot hold them inline without images). Must not
compute figures (summary.py does) or read files.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tuner import __version__
from tuner.core import series as S
from tuner.report.acceptance_profile import bucket_table
from tuner.report.html import _rel, _when
from tuner.core import setting as vocab
from tuner.core.redact import redact
from tuner.core.segments import setting_key, setting_label
from tuner.report.rows import GPU_TABLE_HEAD, gpu_table_rows
from tuner.report.summary import Summary
from tuner.report.svg import fmt_clock


def _n(x: Any, fmt: str = "{:.1f}") -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return fmt.format(x)
    return "n/a"


class Md(str):
    """Text that is already Markdown (built here from escaped parts): not escaped again."""


# Markdown's inline markup; `_` only where it could start or end emphasis (not inside draft_tokens).
_MD_SPECIAL = re.compile(r"([\\`*\[\]|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z]))")


def _esc(x: Any) -> str:
    """A string from the server or the file as plain text: no HTML (as the HTML report escapes it),
    no Markdown markup, one line. Control characters go too (they are terminal or HTML control)."""
    if isinstance(x, Md):
        return str(x)
    text = _CONTROL.sub(" ", str(x))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _code(x: Any) -> Md:
    """Inline code of any text: a backtick fence longer than any run inside (HTML in code is inert)."""
    text = _CONTROL.sub(" ", str(x))
    fence = "`" * (max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return Md(f"{fence}{pad}{text}{pad}{fence}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _cell(x: Any) -> str:
    return _esc(x)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render(s: Summary) -> str:
    d, h = s.data, s.data.header
    info = d.server_info()
    e = _esc
    out = [f"# specdecode-tune report — {e(d.path.name)}", "",
           f"{e(h.get('backend', '?'))} {e(info.get('version') or '')} · model {e(info.get('model') or '?')} · "
           f"TP {e(info.get('tp_size') or '?')} · {e(h.get('url') or '')}  ",
           f"recorded {_when(h.get('created_at'))} for {fmt_clock(d.length_s)} (m:ss) by specdecode-tune "
           f"{e(h.get('tool_version') or '?')} (schema {e(h.get('schema_version'))}); "
           f"report by specdecode-tune {__version__}", ""]
    for p in d.problems:
        out += [f"> **Recording problem:** {e(p)}", ""]
    for f in s.flags:
        out += [f"> **{e(f)}**", ""]
    out += ["## Fastest setting", ""]
    out += ([e(x) for x in s.verdict.sentences for x in (x, "")] if s.verdict
            else ["No tok/s readings while a setting was settled: nothing to rank.", ""])
    out += ["## Settings tried", ""]
    if s.rows:
        phases = [p for p in S.PHASES if any(p in r.phase_ms for r in s.rows)]
        best = s.verdict.best.key if s.verdict else None
        head = ["setting", "active s", "windows", "tok/s median", "server tok/s", "client tok/s", "accept len",
                "batch"] + [f"{p} ms (comm)" for p in phases] + ["wall ms", "comm share draft", "comm share verify"]
        rows = []
        for r in s.rows:
            rows.append([Md("**" + e(r.label) + "**") if r.key == best else r.label, _n(r.seconds, "{:.0f}"), len(r.windows),
                         _n(r.tok_s), _n(r.server_tok_s), _n(r.client_tok_s), _n(r.accept_len, "{:.2f}"),
                         _n(r.batch, "{:.2f}")]
                        + [f"{_n(r.phase_ms.get(p), '{:.2f}')} ({_n(r.comm_ms.get(p), '{:.2f}')})" for p in phases]
                        + [_n(r.wall_ms, "{:.2f}"), _n(r.comm_share("draft") * 100, "{:.0f} %"),
                           _n(r.comm_share("verify") * 100, "{:.0f} %")])
        out += [_table(head, rows), "",
                f"tok/s median: 1-s windows of {_code(s.ranking_series)} after settling (2 s / 20 iterations), "
                "without server gaps and profiler captures. Phase ms: inclusive per iteration on rank 0; "
                "the collective part in brackets is inside it, not added.", ""]
        ks = sorted({k for r in s.rows for k in r.accept_pos})
        if ks:
            out += ["### Per-position acceptance p_k", "",
                    _table(["setting"] + [f"p{k}" for k in ks],
                           [[r.label] + [_n(r.accept_pos.get(k), "{:.3f}") for k in ks] for r in s.rows]), ""]
        bhead, brows = bucket_table(s.acceptance)
        if brows:
            out += ["### Acceptance by batch size and context length", "", _table(bhead, brows), "",
                    "p_k: share of verify rounds accepting draft k; α_k = p_k / p_(k−1). A request-verify counts in "
                    "the bucket of its batch size and of its context length (tokens before the verify).", ""]
        gpu_rows = gpu_table_rows(s.rows)
        if gpu_rows:
            out += ["### GPUs per setting (NVML, means over the setting's time)", "",
                    _table(GPU_TABLE_HEAD, gpu_rows), ""]
    else:
        out += ["No setting could be measured.", ""]
    from tuner.report.latency import markdown as latency_md
    out += latency_md(s.latency, _table, lambda t: _rel(s, t), e)
    if s.controller:
        from tuner.report.controller import HEAD, caption, table_rows
        approx = " (approximate)" if s.controller.get("approximate") else ""
        out += [f"## Adaptive controller vs the tuned schedule{approx}", "",
                _table(HEAD, table_rows(s.controller)), "", e(caption(s.controller)), ""]
    if s.remedies:
        from tuner.report.remedies import TITLE
        out += [f"## {TITLE}", ""] + [f"- {e(x)}" for x in s.remedies] + [""]
    if s.gaps:
        out += ["## Server gaps", "", _table(["from", "to", "seconds", "error"],
                                              [[_rel(s, a), _rel(s, b), _n(b - a), e] for a, b, e in s.gaps]), ""]
    out += ["## Trace captures", ""]
    if s.captures:
        for c in s.captures:
            out.append(f"**{e(c['trace_id'])}** at {_rel(s, c['t'])}: {e(c['ranks'])} rank file(s), "
                       f"mode {e(c['mode'] or 'none')}, "
                       f"wall {_n(c['wall_ms'], '{:.2f}')} ms, skew {_n(c['skew_ms'], '{:.2f}')} ms")
            if c["phases"]:
                out += ["", _table(["phase (rank 0 mean)", "work ms", "collective ms"],
                                   [[p, _n(v.get("ms"), "{:.3f}"), _n(v.get("comm_ms"), "{:.3f}")]
                                    for p, v in c["phases"].items()])]
            out += [f"> {e(w)}" for w in c["warnings"]] + [""]
    else:
        out += ["None.", ""]
    if s.tuning:
        out += ["## Tuning", "", _table(["time", "event", "what"], [[_rel(s, r["t"]), r["kind"], r["summary"]]
                                                                    for r in s.tuning]), ""]
        if s.predictions:
            out += ["### Predictions (last fit)", "",
                    _table(["setting", "predicted tok/s", "sd", "tau", "T ms", "measured tok/s"],
                           [[vocab.pairs(p) or "unknown setting",
                             _n(p.get("tok_s")), _n(p.get("sd")), _n(p.get("tau"), "{:.2f}"), _n(p.get("t_ms"), "{:.2f}"),
                             _n(p.get("measured_tok_s"))]
                            for p in sorted(s.predictions, key=lambda p: -(p.get("tok_s") or 0))[:40]]), ""]
    out += ["## Setting changes", "", _table(["time", "setting", "source"],
                                             [[_rel(s, g.t0), setting_label(g.key), g.source] for g in s.segments]), ""]
    start = info.get("active") or h.get("active") or {}
    launch = redact(info.get("launch") or h.get("launch") or {})
    out += ["## Server configuration", "", "Active at start: " +
            ", ".join(_code(f"{k}={start.get(k)}") for k in vocab.args() if k in start), "",
            "<details><summary>Launch arguments</summary>", "",
            _table(["argument", "value"], [[k, v] for k, v in sorted(launch.items())]), "", "</details>", ""]
    if h.get("command"):
        out += [f"Recorded with {_code(h.get('command'))}.", ""]
    return "\n".join(out)


__all__ = ["render", "setting_key"]
