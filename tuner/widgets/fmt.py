"""Small text helpers shared by the widgets: numbers with NaN as "n/a", relative times, bars.

Pure functions over plain values; they must not read the store, the clock or the terminal, so the
same input always draws the same text (snapshot tests rely on it).
"""

from __future__ import annotations

import math

NA = "n/a"
# Eighth blocks give a bar 8x the resolution of whole cells.
_EIGHTHS = " ▏▎▍▌▋▊▉█"
_SPARK = "▁▂▃▄▅▆▇█"


def is_num(x: object) -> bool:
    return isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x))


def num(x: float | None, digits: int = 1, unit: str = "") -> str:
    """`12.3 ms`, or "n/a" for None and NaN."""
    if x is None or not is_num(x):
        return NA
    return f"{x:.{digits}f}{(' ' + unit) if unit else ''}"


def pct(x: float | None, digits: int = 0) -> str:
    return NA if x is None or not is_num(x) else f"{x:.{digits}f}%"


def rel_time(t: float) -> str:
    """Seconds since the session started as `+1:05.2`; never wall-clock time."""
    if not is_num(t):
        return "  ?  "
    sign = "-" if t < 0 else "+"
    t = abs(t)
    minutes, seconds = divmod(t, 60.0)
    if minutes >= 60:
        hours, minutes = divmod(minutes, 60)
        return f"{sign}{int(hours)}:{int(minutes):02d}:{seconds:04.1f}"
    return f"{sign}{int(minutes)}:{seconds:04.1f}"


def hbar(fraction: float, width: int) -> str:
    """A left-aligned bar `width` cells wide filled to `fraction` (clamped to 0..1)."""
    if not is_num(fraction) or width <= 0:
        return " " * max(width, 0)
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    bar = "█" * full + (_EIGHTHS[rest] if rest else "")
    return bar.ljust(width)


def sparkline(values: list[float], width: int, top: float | None = None) -> str:
    """The last `width` values as block characters; NaN shows as a space."""
    values = values[-width:]
    finite = [v for v in values if is_num(v)]
    if not finite:
        return " " * width
    hi = top if top else max(finite) or 1.0
    out = []
    for v in values:
        if not is_num(v):
            out.append(" ")
        else:
            out.append(_SPARK[max(0, min(7, int(v / hi * 7.999)))])
    return "".join(out).rjust(width)


def bytes_rate(x: float | None) -> str:
    """Bytes per second in the shortest readable unit (`1.2G`, `340M`, `12K`)."""
    if x is None or not is_num(x):
        return NA
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= size:
            v = x / size
            return f"{v:.0f}{unit}" if abs(v) >= 10 else f"{v:.1f}{unit}"
    return f"{x:.0f}"
