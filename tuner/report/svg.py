"""Inline SVG charts for the HTML report: lines over time, stacked bars, grouped bars. No JS, no fonts
to fetch, no libraries: each function returns one `<svg>` string that any browser draws offline.

Long series are reduced to one mean point per horizontal pixel column before drawing, so a report of
an hours-long recording stays small. Must not read recordings or compute figures; callers pass data.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Sequence

from probes.names import DRAFT, DRAFT_EXTEND, OTHER, PREFILL, VERIFY, VERIFY_SAMPLE
from tuner.core.text import terminal_safe

# Colour-blind-safe palette (Okabe-Ito), one colour per line or phase.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
PHASE_COLORS = {PREFILL: "#CC79A7", DRAFT: "#0072B2", VERIFY: "#D55E00", VERIFY_SAMPLE: "#F0E442",
                DRAFT_EXTEND: "#009E73", OTHER: "#999999", "idle": "#DDDDDD"}
FONT = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif"


def esc(s: object) -> str:
    """Text for HTML or SVG: escaped, and without escape sequences or control characters (server
    strings are data: a raw ESC reached the report from a server's model name)."""
    return html.escape(terminal_safe(s, keep_newlines=True), quote=True)


@dataclass
class Line:
    label: str
    t: Sequence[float]
    v: Sequence[float]
    color: str = PALETTE[0]


@dataclass
class Marker:
    """A vertical line at t (a setting change, a capture) with a short label."""

    t: float
    label: str
    color: str = "#555555"
    dash: str = "4 3"


@dataclass
class Band:
    """A shaded time span (the server was gone, a capture ran)."""

    t0: float
    t1: float
    label: str
    color: str = "#F4CCCC"


@dataclass
class Frame:
    width: int = 900
    height: int = 260
    left: int = 60
    right: int = 16
    top: int = 28
    bottom: int = 36

    @property
    def pw(self) -> int:
        return self.width - self.left - self.right

    @property
    def ph(self) -> int:
        return self.height - self.top - self.bottom


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out, x = [], first
    while x <= hi + step * 1e-9:
        out.append(round(x, 10))
        x += step
    return out


def fmt_num(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x / 1000:g}k"
    return f"{x:g}" if abs(x) >= 0.01 else f"{x:.1e}"


def fmt_clock(s: float) -> str:
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def reduce_points(t: Sequence[float], v: Sequence[float], t0: float, t1: float, columns: int) -> list[tuple[float, float]]:
    """One (mean t, mean v) per pixel column; NaN readings are left out, and a column with none
    breaks the line (returned as a NaN point)."""
    if t1 <= t0:
        return [(a, b) for a, b in zip(t, v) if not math.isnan(b)]
    width = (t1 - t0) / max(1, columns)
    out: list[tuple[float, float]] = []
    col, st, sv, n = None, 0.0, 0.0, 0
    last_t = None
    for a, b in zip(t, v):
        if math.isnan(b):
            continue
        c = int((a - t0) // width)
        if c != col:
            if n:
                out.append((st / n, sv / n))
            if col is not None and last_t is not None and a - last_t > max(5.0, 20 * width):
                out.append((math.nan, math.nan))     # a real hole in the data: do not bridge it
            col, st, sv, n = c, 0.0, 0.0, 0
        st, sv, n = st + a, sv + b, n + 1
        last_t = a
    if n:
        out.append((st / n, sv / n))
    return out


def _legend(items: list[tuple[str, str]], f: Frame, kind: str = "line") -> tuple[str, int]:
    """The legend under the plot, wrapped into rows; returns (svg, extra height it needs)."""
    rows: list[list[tuple[str, str, int]]] = [[]]
    cx = f.left + 4
    for label, color in items:
        w = 28 + 7 * len(label)
        if rows[-1] and cx + w > f.width - 4:
            rows.append([])
            cx = f.left + 4
        rows[-1].append((label, color, cx))
        cx += w
    extra = 16 * (len(rows) - 1)
    parts = []
    for r, row in enumerate(rows):
        y = f.height - 4 + 16 * r
        for label, color, x in row:
            if kind == "line":
                parts.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" stroke="{color}" stroke-width="2.5"/>')
            else:
                parts.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
            parts.append(f'<text x="{x + 20}" y="{y}" font-size="12">{esc(label)}</text>')
    return "".join(parts), extra


def _finish(out: list[str], f: Frame, items: list[tuple[str, str]], kind: str) -> str:
    """Close the chart with its legend, growing the canvas downwards when the legend wraps."""
    legend, extra = _legend(items, f, kind)
    head = out[0]
    if extra:
        h = f.height + extra
        head = head.replace(f'height="{f.height}" viewBox="0 0 {f.width} {f.height}"',
                            f'height="{h}" viewBox="0 0 {f.width} {h}"', 1)
        head = head.replace(f'<rect width="{f.width}" height="{f.height}"', f'<rect width="{f.width}" height="{h}"', 1)
    return head + "".join(out[1:]) + legend + "</svg>"


def line_chart(title: str, lines: list[Line], *, t0: float, t1: float, y_label: str = "",
               markers: Sequence[Marker] = (), bands: Sequence[Band] = (), frame: Frame | None = None,
               y_min: float | None = 0.0, css_class: str = "chart") -> str:
    """Lines over recording time (x labelled m:ss from t0) with change markers and shaded bands."""
    f = frame or Frame()
    pts = [reduce_points(ln.t, ln.v, t0, t1, f.pw) for ln in lines]
    vals = [y for p in pts for _, y in p if not math.isnan(y)]
    if not vals:
        return _empty(title, f, "no readings in this recording", css_class)
    lo = min(vals) if y_min is None else min(y_min, min(vals))
    hi = max(vals)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    hi += (hi - lo) * 0.05
    span = max(t1 - t0, 1e-9)

    def X(t: float) -> float:
        return f.left + (t - t0) / span * f.pw

    def Y(v: float) -> float:
        return f.top + f.ph - (v - lo) / (hi - lo) * f.ph

    out = [_open(f, title, css_class)]
    for b in bands:
        x0, x1 = X(max(b.t0, t0)), X(min(b.t1, t1))
        out.append(f'<rect x="{x0:.1f}" y="{f.top}" width="{max(1.0, x1 - x0):.1f}" height="{f.ph}" '
                   f'fill="{b.color}" opacity="0.6"><title>{esc(b.label)}</title></rect>')
    out.append(_axes(f, nice_ticks(lo, hi), Y, y_label))
    for tick in nice_ticks(0, span, 8):
        x = X(t0 + tick)
        out.append(f'<line x1="{x:.1f}" y1="{f.top + f.ph}" x2="{x:.1f}" y2="{f.top + f.ph + 4}" stroke="#333"/>'
                   f'<text x="{x:.1f}" y="{f.top + f.ph + 16}" font-size="11" text-anchor="middle">{fmt_clock(tick)}</text>')
    last_x, row = -1e9, 0
    for m in sorted(markers, key=lambda m: m.t):
        if t0 <= m.t <= t1:
            x = X(m.t)
            # Labels of changes close together go on alternate rows so they stay readable.
            row = (row + 1) % 3 if x - last_x < 7 * len(m.label) else 0
            last_x = x
            out.append(f'<line x1="{x:.1f}" y1="{f.top}" x2="{x:.1f}" y2="{f.top + f.ph}" stroke="{m.color}" '
                       f'stroke-dasharray="{m.dash}" stroke-width="1.2"><title>{esc(m.label)}</title></line>'
                       f'<text x="{x + 3:.1f}" y="{f.top + 11 + 12 * row}" font-size="10" fill="{m.color}">{esc(m.label)}</text>')
    for ln, p in zip(lines, pts):
        d, pen = [], "M"
        for t, v in p:
            if math.isnan(v):
                pen = "M"
                continue
            d.append(f"{pen}{X(t):.1f},{Y(v):.1f}")
            pen = "L"
        if d:
            out.append(f'<path d="{" ".join(d)}" fill="none" stroke="{ln.color}" stroke-width="1.8" '
                       f'stroke-linejoin="round"><title>{esc(ln.label)}</title></path>')
    return _finish(out, f, [(ln.label, ln.color) for ln in lines], "line")


def stacked_bars(title: str, categories: list[str], stacks: list[tuple[str, list[float], str]], *,
                 y_label: str = "", frame: Frame | None = None, css_class: str = "chart",
                 totals: list[float] | None = None) -> str:
    """One bar per category, stacked from `stacks` = [(name, value per category, colour)].
    Only parts that add up may be stacked (docs/ARCHITECTURE.md "Names and contracts": never a phase
    with its comm part)."""
    f = frame or Frame(height=300, bottom=70)
    sums = [sum(v[i] for _, v, _ in stacks if not math.isnan(v[i])) for i in range(len(categories))]
    top = max(sums + (totals or []) + [0.0])
    if not categories or top <= 0:
        return _empty(title, f, "no phase times in this recording", css_class)
    hi = top * 1.08

    def Y(v: float) -> float:
        return f.top + f.ph - v / hi * f.ph

    out = [_open(f, title, css_class), _axes(f, nice_ticks(0, hi), Y, y_label)]
    slot = f.pw / len(categories)
    bw = min(90.0, slot * 0.6)
    for i, cat in enumerate(categories):
        x = f.left + slot * i + (slot - bw) / 2
        base = 0.0
        for name, vals, color in stacks:
            v = vals[i]
            if math.isnan(v) or v <= 0:
                continue
            out.append(f'<rect x="{x:.1f}" y="{Y(base + v):.1f}" width="{bw:.1f}" height="{Y(base) - Y(base + v):.1f}" '
                       f'fill="{color}" stroke="#fff" stroke-width="0.5"><title>{esc(cat)}: {esc(name)} {v:.3f}</title></rect>')
            base += v
        if totals and i < len(totals) and not math.isnan(totals[i]):
            yt = Y(totals[i])
            out.append(f'<line x1="{x - 4:.1f}" y1="{yt:.1f}" x2="{x + bw + 4:.1f}" y2="{yt:.1f}" stroke="#000" '
                       f'stroke-dasharray="3 2"><title>{esc(cat)}: wall {totals[i]:.3f}</title></line>')
        out.append(f'<text x="{x + bw / 2:.1f}" y="{Y(base) - 4:.1f}" font-size="11" text-anchor="middle">{base:.1f}</text>')
        out.append(_wrap_label(cat, x + bw / 2, f.top + f.ph + 14))
    return _finish(out, f, [(n, c) for n, _, c in stacks] + ([("wall (dashed)", "#000")] if totals else []), "box")


def grouped_bars(title: str, groups: list[str], bars: list[tuple[str, list[float], str]], *, y_label: str = "",
                 frame: Frame | None = None, y_max: float | None = None, css_class: str = "chart") -> str:
    """Groups along x (e.g. draft position k), one bar per series in each group (e.g. per setting)."""
    f = frame or Frame(height=280)
    vals = [v for _, vs, _ in bars for v in vs if not math.isnan(v)]
    if not groups or not vals:
        return _empty(title, f, "no readings in this recording", css_class)
    hi = y_max if y_max is not None else max(vals) * 1.1 or 1.0

    def Y(v: float) -> float:
        return f.top + f.ph - min(v, hi) / hi * f.ph

    out = [_open(f, title, css_class), _axes(f, nice_ticks(0, hi), Y, y_label)]
    slot = f.pw / len(groups)
    bw = min(28.0, slot * 0.8 / max(1, len(bars)))
    for g, name in enumerate(groups):
        x0 = f.left + slot * g + (slot - bw * len(bars)) / 2
        for b, (label, vs, color) in enumerate(bars):
            v = vs[g] if g < len(vs) else math.nan
            if math.isnan(v):
                continue
            x = x0 + b * bw
            out.append(f'<rect x="{x:.1f}" y="{Y(v):.1f}" width="{bw - 1:.1f}" height="{Y(0) - Y(v):.1f}" fill="{color}">'
                       f'<title>{esc(label)} {esc(name)}: {v:.3f}</title></rect>')
        out.append(f'<text x="{f.left + slot * g + slot / 2:.1f}" y="{f.top + f.ph + 16}" font-size="12" '
                   f'text-anchor="middle">{esc(name)}</text>')
    return _finish(out, f, [(n, c) for n, _, c in bars], "box")


def _open(f: Frame, title: str, css_class: str) -> str:
    return (f'<svg class="{esc(css_class)}" xmlns="http://www.w3.org/2000/svg" width="{f.width}" height="{f.height}" '
            f'viewBox="0 0 {f.width} {f.height}" role="img" aria-label="{esc(title)}" style="{FONT}">'
            f'<rect width="{f.width}" height="{f.height}" fill="#fff"/>'
            f'<text x="{f.left}" y="18" font-size="14" font-weight="600">{esc(title)}</text>')


def _axes(f: Frame, ticks: list[float], Y, y_label: str) -> str:
    out = [f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{f.top + f.ph}" stroke="#333"/>',
           f'<line x1="{f.left}" y1="{f.top + f.ph}" x2="{f.left + f.pw}" y2="{f.top + f.ph}" stroke="#333"/>']
    for t in ticks:
        y = Y(t)
        if f.top - 1 <= y <= f.top + f.ph + 1:
            out.append(f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.left + f.pw}" y2="{y:.1f}" stroke="#eee"/>'
                       f'<text x="{f.left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{fmt_num(t)}</text>')
    if y_label:
        out.append(f'<text x="14" y="{f.top + f.ph / 2:.0f}" font-size="11" text-anchor="middle" '
                   f'transform="rotate(-90 14 {f.top + f.ph / 2:.0f})">{esc(y_label)}</text>')
    return "".join(out)


def _wrap_label(text: str, x: float, y: float, width: int = 18) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    if cur:
        lines.append(cur)
    return "".join(f'<text x="{x:.1f}" y="{y + 12 * i:.1f}" font-size="10" text-anchor="middle">{esc(s)}</text>'
                   for i, s in enumerate(lines[:4]))


def _empty(title: str, f: Frame, why: str, css_class: str) -> str:
    return (_open(f, title, css_class + " empty") +
            f'<text x="{f.width / 2}" y="{f.height / 2}" font-size="13" text-anchor="middle" fill="#777">{esc(why)}</text></svg>')
