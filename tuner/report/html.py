"""The HTML report: one self-contained page (inline CSS and SVG; no script, no fonts, no network).

Order: what was recorded, problems and emulation flags, the verdict (fastest setting and why), the
charts over time, the table of settings, the phase split, per-position acceptance, GPU activity,
trace captures, tuning, events, the server's configuration. Must not compute figures (summary.py
does) or read files.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Mapping

from probes.names import TOPK
from tuner import __version__
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import thaw
from tuner.report import svg
from tuner.core import setting as vocab
from tuner.core.redact import redact
from tuner.core.segments import setting_key, setting_label
from tuner.report.rows import GPU_TABLE_HEAD, gpu_indices, gpu_table_rows
from tuner.report.summary import Summary
from tuner.report.svg import PALETTE, PHASE_COLORS, Band, Frame, Line, Marker, esc

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1320px;color:#222;line-height:1.4;font-size:14px}
h1{font-size:22px;margin-bottom:4px}h3{font-size:14px;margin:14px 0 4px}.wide{overflow-x:auto}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:3px}
.sub{color:#555;font-size:13px}.banner{padding:8px 12px;border-radius:4px;margin:8px 0;font-size:14px}
.problem{background:#fff4ce;border:1px solid #e0c060}.flag{background:#fde2d2;border:1px solid #d55e00;font-weight:600}
.verdict{background:#e6f2ea;border:1px solid #009e73;padding:10px 14px;border-radius:4px}
.verdict p{margin:4px 0}table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;vertical-align:top}th{background:#f4f4f4}
td.l,th.l{text-align:left}tr.best td{background:#e6f2ea;font-weight:600}svg.chart{display:block;margin:10px 0;max-width:100%;height:auto}
.note{color:#666;font-size:12px}code{font-size:12px}details summary{cursor:pointer;color:#0072b2}
"""

MAX_EVENT_ROWS = 300
NOTABLE = (EventKind.CONNECTED, EventKind.DISCONNECTED, EventKind.SERVER_INFO, EventKind.CONFIG_CHANGED,
           EventKind.CONFIG_REFUSED, EventKind.LOAD_STARTED, EventKind.LOAD_STOPPED, EventKind.LOAD_ERROR,
           EventKind.PHASE_GAP, EventKind.TRACE_CAPTURED, EventKind.NOTE, EventKind.POLL_ERROR)


def _n(x: Any, fmt: str = "{:.1f}") -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return fmt.format(x)
    return "n/a"


def _pct(x: float) -> str:
    return _n(x * 100 if isinstance(x, (int, float)) else x, "{:.0f} %")


def _when(epoch: Any) -> str:
    try:
        return datetime.fromtimestamp(float(epoch), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "unknown"


def _rel(s: Summary, t: float) -> str:
    return svg.fmt_clock(t - s.data.t_first) if math.isfinite(s.data.t_first) else "?"


def _table(head: list[str], rows: list[list[str]], left: int = 1, classes: list[str] | None = None) -> str:
    th = "".join(f'<th class="l">{esc(h)}</th>' if i < left else f"<th>{esc(h)}</th>" for i, h in enumerate(head))
    body = []
    for r, row in enumerate(rows):
        cls = f' class="{classes[r]}"' if classes and classes[r] else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="l">{c}</td>' if i < left else f"<td>{c}</td>"
                                           for i, c in enumerate(row)) + "</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def _markers(s: Summary) -> tuple[list[Marker], list[Band]]:
    markers, bands = [], []
    for seg in s.segments:
        if seg.source in (EventKind.CONFIG_CHANGED, EventKind.SERVER_INFO):
            markers.append(Marker(seg.t0, " ".join(f"{k.name}={v}" for k, v in zip(vocab.knobs(), seg.key)
                                                   if v is not None and k.arg != TOPK)))
    for a, b, err in s.gaps:
        bands.append(Band(a, b, f"server gone: {err}", "#F4CCCC"))
    for a, b, tid in s.excluded:
        bands.append(Band(a, b, f"profiler capture {tid} (left out of the figures)", "#E8D5F0"))
    for e in s.data.events(EventKind.TRACE_CAPTURED):
        markers.append(Marker(e.t, "trace", "#CC79A7", "1 2"))
    return markers, bands


def charts_over_time(s: Summary) -> str:
    d = s.data
    t0, t1 = d.t_first, d.t_last
    if not math.isfinite(t0):
        return '<p class="note">The recording holds no readings.</p>'
    markers, bands = _markers(s)
    out = []
    lines = []
    for name, label, color in ((S.SERVER_TOK_PER_S, "server decode tok/s", PALETTE[0]),
                               (S.LOAD_TOK_PER_S, "client tok/s (load driver)", PALETTE[1])):
        ser = d.get(name)
        if len(ser.t):
            lines.append(Line(label, ser.t, ser.v, color))
    out.append(svg.line_chart("Throughput over time (dashed: setting changes; red: server gone; violet: trace capture)", lines, t0=t0, t1=t1,
                              y_label="tok/s", markers=markers, bands=bands))
    acc = [Line("accept length τ", d.get(S.SPEC_ACCEPT_LEN).t, d.get(S.SPEC_ACCEPT_LEN).v, PALETTE[2])]
    out.append(svg.line_chart("Accept length over time (tokens per verify, bonus included)", acc, t0=t0, t1=t1,
                              y_label="tokens", markers=markers, bands=bands))
    return "".join(out)


def settings_table(s: Summary) -> str:
    if not s.rows:
        return '<p class="note">No setting could be measured (no readings while a setting was active).</p>'
    phases = [p for p in S.PHASES if any(p in r.phase_ms for r in s.rows)]
    rank_name = "client" if s.ranking_series == S.LOAD_TOK_PER_S else "server"
    head = ["setting", "active s", "1-s windows", f"tok/s median ({rank_name})", "server tok/s", "client tok/s",
            "accept len", "accept rate", "batch"] + [f"{p} ms" for p in phases] + \
           ["wall ms", "collective share of draft", "collective share of verify"]
    best = s.verdict.best.key if s.verdict else None
    rows, classes = [], []
    for r in s.rows:
        rows.append([esc(r.label), _n(r.seconds, "{:.0f}"), str(len(r.windows)), _n(r.tok_s), _n(r.server_tok_s),
                     _n(r.client_tok_s), _n(r.accept_len, "{:.2f}"), _n(r.accept_rate, "{:.2f}"), _n(r.batch, "{:.2f}")]
                    + [_n(r.phase_ms.get(p), "{:.2f}") + (f' <span class="note">({_n(r.comm_ms.get(p), "{:.2f}")})</span>'
                                                         if r.comm_ms.get(p) else "") for p in phases]
                    + [_n(r.wall_ms, "{:.2f}"), _pct(r.comm_share("draft")), _pct(r.comm_share("verify"))])
        classes.append("best" if r.key == best else "")
    return ('<div class="wide">' + _table(head, rows, classes=classes) + "</div>" +
            '<p class="note">Figures exclude the first 2 s / 20 iterations after each change, the time the server '
            'was gone and the time a profiler capture ran. Phase columns: inclusive ms per iteration on rank 0; '
            'in brackets the part spent in collectives (already inside the phase time, never added to it).</p>')


def phase_charts(s: Summary) -> str:
    rows = [r for r in s.rows if r.phase_ms]
    if not rows:
        return '<p class="note">No phase timers in this recording (a server without the engine\'s phase stream or our plugin).</p>'
    cats = [r.label for r in rows]
    phases = [p for p in S.PHASES if any(p in r.phase_ms for r in rows)]
    nan = math.nan
    work = [(p, [r.phase_ms.get(p, nan) for r in rows], PHASE_COLORS[p]) for p in phases]
    out = [svg.stacked_bars("Where an iteration's time goes, per setting (ms, rank 0)", cats, work,
                            y_label="ms per iteration", totals=[r.wall_ms for r in rows],
                            frame=Frame(height=320, bottom=90))]
    comm = [(p, [r.comm_ms.get(p, nan) for r in rows], PHASE_COLORS[p]) for p in phases]
    if any(not math.isnan(v) and v > 0 for _, vs, _ in comm for v in vs):
        out.append(svg.stacked_bars("…of which in collectives (ms; the same time seen from the comm side)", cats, comm,
                                    y_label="ms per iteration", frame=Frame(height=300, bottom=90)))
    return "".join(out)


def acceptance_chart(s: Summary) -> str:
    rows = [r for r in s.rows if r.accept_pos]
    if not rows:
        return '<p class="note">No per-position acceptance in this recording.</p>'
    ks = sorted({k for r in rows for k in r.accept_pos})
    bars = [(r.label, [r.accept_pos.get(k, math.nan) for k in ks], PALETTE[i % len(PALETTE)]) for i, r in enumerate(rows)]
    return svg.grouped_bars("Per-position acceptance p_k (share of verifies accepting draft k)",
                            [f"k={k}" for k in ks], bars, y_label="p_k", y_max=1.0,
                            frame=Frame(height=300, bottom=60 + 16 * ((len(rows) - 1) // 2)))


def acceptance_buckets(s: Summary) -> str:
    from tuner.report.acceptance_profile import bucket_table
    head, rows = bucket_table(s.acceptance)
    if not rows:
        return ""
    return ("<h3>By batch size and context length</h3>" + '<div class="wide">'
            + _table(head, [[esc(c) for c in r] for r in rows], left=2) + "</div>"
            + '<p class="note">p_k / α_k: share of verify rounds accepting draft k, and the same given draft k−1 '
              "was accepted. A request-verify counts in the bucket of its batch size and of its context length.</p>")


def latency_section(s: Summary) -> str:
    """tuner.report.latency's section, its charts with the setting changes marked; "" without latency."""
    from tuner.report import latency as LT
    d = s.data

    def chart(title: str, lines: list, unit: str) -> str:
        return svg.line_chart(title, [Line(label, t, v, PALETTE[i]) for i, (label, t, v) in enumerate(lines)],
                              t0=d.t_first, t1=d.t_last, y_label=unit, markers=_markers(s)[0])
    return LT.html(s.latency, _table, lambda t: _rel(s, t), esc, chart)


def remedies_section(s: Summary) -> str:
    """What the server lets the operator change, predicted (tuner.report.remedies); "" when nothing."""
    if not s.remedies:
        return ""
    from tuner.report.remedies import TITLE
    return f"<h2>{esc(TITLE)}</h2><ul>" + "".join(f"<li>{esc(x)}</li>" for x in s.remedies) + "</ul>"


def controller_section(s: Summary) -> str:
    """The server's adaptive controller checked (tuner.report.controller); "" when it ran none."""
    if not s.controller:
        return ""
    from tuner.report.controller import HEAD, caption, table_rows
    approx = " (approximate)" if s.controller.get("approximate") else ""
    return (f"<h2>Adaptive controller vs the tuned schedule{esc(approx)}</h2>" + '<div class="wide">'
            + _table(HEAD, [[esc(c) for c in r] for r in table_rows(s.controller)], left=1) + "</div>"
            + f'<p class="note">{esc(caption(s.controller))}</p>')


def gpu_charts(s: Summary) -> str:
    d = s.data
    gpus = [f"gpu{i}" for i in gpu_indices(d)]
    if not gpus:
        return ('<p class="note">No GPU readings: the server ran on CPU, on another host, or NVML was not '
                'available where the recording was made.</p>')
    markers, bands = _markers(s)
    out = []
    rows = gpu_table_rows(s.rows)
    if rows:
        out.append("<h3>Per setting (NVML, means over the setting's time)</h3>"
                   + _table(GPU_TABLE_HEAD, [[esc(c) for c in r] for r in rows], left=2))
    for metric, title, unit in (("sm_active_pct", "SM activity (GPM)", "%"), ("util_pct", "GPU utilisation", "%"),
                                ("power_w", "Power", "W"), ("nvlink_tx_mbps", "NVLink transmit", "MB/s")):
        lines = [Line(g, d.get(f"{g}/{metric}").t, d.get(f"{g}/{metric}").v, PALETTE[i % len(PALETTE)])
                 for i, g in enumerate(gpus) if len(d.get(f"{g}/{metric}").t)]
        if lines and any(not math.isnan(v) for ln in lines for v in ln.v):
            out.append(svg.line_chart(f"{title} per GPU", lines, t0=d.t_first, t1=d.t_last, y_label=unit,
                                      markers=markers, bands=bands, css_class="chart gpu"))
    return "".join(out) or '<p class="note">GPU series recorded, but none with readings.</p>'


def captures_section(s: Summary) -> str:
    if not s.captures:
        return '<p class="note">No profiler trace was captured (record with <code>--capture-trace-every 5m</code>).</p>'
    out = []
    for c in s.captures:
        title = (f"{esc(c['trace_id'])} at {_rel(s, c['t'])}: {c['ranks']} rank file(s), "
                 f"{c['bytes'] / 1e6:.2f} MB, analysis mode {esc(c['mode'] or 'none')}")
        rows = [[esc(p), _n(v.get("ms"), "{:.3f}"), _n(v.get("comm_ms"), "{:.3f}"), _n(v.get("span_ms"), "{:.3f}")]
                for p, v in c["phases"].items()]
        body = _table(["phase (rank 0, mean per iteration)", "work ms", "collective ms", "span ms"], rows) if rows else ""
        extra = (f"<p>wall {_n(c['wall_ms'], '{:.2f}')} ms, idle {_n(c['idle_ms'], '{:.2f}')} ms over "
                 f"{c['iterations'] if c['iterations'] is not None else 'n/a'} iterations; cross-rank skew "
                 f"{_n(c['skew_ms'], '{:.2f}')} ms, slowest rank {c['slowest_rank'] if c['slowest_rank'] is not None else 'n/a'}</p>")
        warn = "".join(f'<p class="note">{esc(w)}</p>' for w in c["warnings"])
        out.append(f"<h3>{title}</h3>{body}{extra if c['mode'] else ''}{warn}")
    out.append('<p class="note">The traces are in the recording; <code>specdecode-tune report FILE --perfetto '
               'trace.json</code> writes them (kernels, our phase spans, the series as counters) for ui.perfetto.dev.</p>')
    return "".join(out)


def tuning_section(s: Summary) -> str:
    if not s.tuning:
        return ""
    out = ["<h2>Tuning</h2>", _table(["time", "event", "what"],
                                     [[_rel(s, r["t"]), esc(r["kind"]), esc(r["summary"])] for r in s.tuning], left=3)]
    if s.predictions:
        measured = {setting_label(r.key): r.tok_s for r in s.rows}
        rows = []
        for p in sorted(s.predictions, key=lambda p: -(p.get("tok_s") or 0))[:40]:
            label = vocab.pairs(p) or "unknown setting"
            m = p.get("measured_tok_s")
            m = m if m is not None else measured.get(label)
            rows.append([esc(label), _n(p.get("tok_s")), _n(p.get("sd")), _n(p.get("tau"), "{:.2f}"),
                         _n(p.get("t_ms"), "{:.2f}"), _n(m), esc(p.get("basis") or "")])
        out.append("<h3>Predictions (last fit)</h3>" +
                   _table(["setting", "predicted tok/s", "± sd", "τ", "T ms", "measured tok/s", "basis"], rows))
    return "".join(out)


def events_section(s: Summary) -> str:
    evs = s.data.events(NOTABLE)
    rows = []
    for e in evs[:MAX_EVENT_ROWS]:
        d = thaw(e.data)
        if e.kind == EventKind.CONFIG_CHANGED:
            what = f"now {setting_label(setting_key(d.get('new')))} (from {d.get('source')})"
        elif e.kind == EventKind.SERVER_INFO:
            what = f"{d.get('kind')} {d.get('version')} · {d.get('model')} · TP {d.get('tp_size')}"
        elif e.kind == EventKind.TRACE_CAPTURED:
            what = f"{d.get('trace_id')} ({d.get('ranks')} ranks, {d.get('mode') or 'no analysis'})"
        else:
            what = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("capabilities", "launch", "active"))[:200]
        rows.append([_rel(s, e.t), esc(e.kind), esc(what)])
    more = f'<p class="note">…and {len(evs) - MAX_EVENT_ROWS} more (see --format json).</p>' if len(evs) > MAX_EVENT_ROWS else ""
    return _table(["time", "event", "details"], rows, left=3) + more if rows else '<p class="note">No events.</p>'


def active_at_end(events: list) -> dict:
    """The active setting as the recording's newest sample of it says: a read-back (server_info,
    config_active) whole, or a change from the phase stream (its knobs and its epoch) over the
    newest read-back's keys that a change does not move. Never one sample's knobs beside another's
    epoch: the "at end" column once showed the end's knobs with the start's config_epoch."""
    whole: dict = {}
    changed: dict | None = None
    for e in events:
        d = e.data
        if e.kind in (EventKind.SERVER_INFO, EventKind.CONFIG_ACTIVE) and isinstance(d.get("active"), Mapping) and d["active"]:
            whole, changed = dict(d["active"]), None
        elif e.kind == EventKind.CONFIG_CHANGED and isinstance(d.get("new"), Mapping):
            changed = {**dict(d["new"]), **({"config_epoch": d["epoch"]} if "epoch" in d else {})}
    if changed is None:
        return whole
    return {**{k: v for k, v in whole.items() if k != "config_epoch"}, **changed}


def config_section(s: Summary) -> str:
    info = s.data.server_info()
    launch = redact(info.get("launch") or s.data.header.get("launch") or {})
    start = info.get("active") or s.data.header.get("active") or {}
    end = active_at_end(s.data.events()) or start
    rows = [[esc(k), esc(v)] for k, v in sorted(launch.items())]
    knobs = vocab.args()
    act = [[esc(k), esc(start.get(k)), esc(end.get(k))]
           for k in sorted(set(start) | set(end) | set(knobs)) if k in start or k in end or k in knobs]
    out = ["<h3>Active setting (internal_states)</h3>", _table(["key", "at start", "at end"], act, left=3),
           "<details><summary>Launch arguments (/server_info top level; never change)</summary>",
           _table(["argument", "value"], rows, left=2), "</details>"]
    gpus = s.data.header.get("gpus") or []
    if gpus:
        out.append("<h3>GPUs</h3>" + _table(["index", "name", "bus id", "rank"],
                                            [[esc(g.get("index")), esc(g.get("name")), esc(g.get("bus_id")),
                                              esc(g.get("rank"))] for g in gpus], left=4))
    ranks = s.data.header.get("ranks") or []
    if ranks:
        out.append("<h3>Rank processes</h3>" + _table(["rank", "pid", "PCI bus id", "host"],
                                                      [[esc(r.get("tp_rank")), esc(r.get("pid")), esc(r.get("pci_bus_id")),
                                                        esc(r.get("host"))] for r in ranks], left=4))
    return "".join(out)


def render(s: Summary) -> str:
    d, h = s.data, s.data.header
    info = d.server_info()
    title = f"specdecode-tune report — {d.path.name}"
    sub = (f"{esc(h.get('backend', '?'))} {esc(info.get('version') or '')} · model {esc(info.get('model') or '?')} · "
           f"TP {esc(info.get('tp_size') or '?')} · {esc(h.get('url') or '')}<br>recorded {_when(h.get('created_at'))}"
           f" for {svg.fmt_clock(d.length_s)} (m:ss) by specdecode-tune {esc(h.get('tool_version') or '?')}"
           f" (schema {esc(h.get('schema_version'))})")
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
             f'<meta name="viewport" content="width=device-width, initial-scale=1">'
             f'<meta name="generator" content="specdecode-tune {esc(__version__)}"><style>{CSS}</style></head><body>',
             f"<h1>{esc(title)}</h1><p class=\"sub\">{sub}</p>"]
    for p in d.problems:
        parts.append(f'<div class="banner problem">Recording problem: {esc(p)}</div>')
    for f in s.flags:
        parts.append(f'<div class="banner flag">{esc(f)}</div>')
    parts.append("<h2>Fastest setting</h2>")
    if s.verdict:
        parts.append('<div class="verdict">' + "".join(f"<p>{esc(x)}</p>" for x in s.verdict.sentences) + "</div>")
    else:
        parts.append('<p class="note">No tok/s readings while a setting was settled: nothing to rank.</p>')
    parts += ["<h2>Over time</h2>", charts_over_time(s),
              "<h2>Settings tried</h2>", settings_table(s),
              "<h2>Phase split per setting</h2>", phase_charts(s),
              latency_section(s),
              "<h2>Per-position acceptance</h2>", acceptance_chart(s), acceptance_buckets(s),
              controller_section(s), remedies_section(s),
              "<h2>GPU activity</h2>", gpu_charts(s),
              "<h2>Trace captures</h2>", captures_section(s),
              tuning_section(s),
              "<h2>Events</h2>", events_section(s),
              "<h2>Server configuration</h2>", config_section(s)]
    cmd = h.get("command")
    parts.append(f'<p class="note">Recorded with <code>{esc(cmd)}</code>.</p>' if cmd else "")
    parts.append(f'<p class="note">Report made by specdecode-tune {esc(__version__)} from {esc(d.path.name)}; '
                 f'self-contained (no scripts, no network).</p></body></html>')
    return "".join(parts)
