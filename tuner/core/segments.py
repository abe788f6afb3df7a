"""Segments: which setting was active when, over a tuner.core.timeline Timeline (a live Store or a
loaded recording), and the one key and label a setting goes by in tables.

A setting is the active table knobs between two change points (`config_changed`, or a
`server_info` whose active setting differs, after a relaunch); time the caller cuts out (the server
away, a profiler capture: tuner.core.timeline.gaps/captures) belongs to no segment, and a
zero-length cut (a load start or stop) only splits one. Pure functions; must not talk to servers,
read files or compute figures (the report does, per segment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tuner.core import setting as vocab
from tuner.core.events import EventKind
from tuner.core.records import thaw
from tuner.core.timeline import Timeline

START = "start"
RESUMED = "resumed"
FIRST_INFO_S = 5.0      # a server_info this soon after the data starts says what ran from the start


def setting_key(active: Mapping[str, Any] | None) -> tuple:
    """A setting's columns: each table knob's active value (server-arg names), in table order."""
    return tuple((active or {}).get(k) for k in vocab.args())


def setting_label(key: tuple) -> str:
    """`steps=3 topk=1 draft_tokens=4 placement=sharded` for a `setting_key`."""
    return vocab.pairs(dict(zip(vocab.args(), key))) or "unknown setting"


@dataclass
class Segment:
    key: tuple
    t0: float
    t1: float
    source: str      # what started it: START, RESUMED or the event kind (config_changed, server_info)


def change_points(tl: Timeline) -> list[tuple[float, tuple, str]]:
    """(t, setting_key, event kind) at every event that states the active setting."""
    points = []
    for e in tl.events((EventKind.CONFIG_CHANGED, EventKind.SERVER_INFO)):
        active = e.data.get("new") if e.kind == EventKind.CONFIG_CHANGED else e.data.get("active")
        if active:
            points.append((e.t, setting_key(thaw(active)), e.kind))
    return points


def segments(tl: Timeline, start_active: Mapping[str, Any] | None,
             cuts: Iterable[Sequence[Any]] = ()) -> list[Segment]:
    """The active setting over [t_first, t_last], from `start_active` (what ran when the data
    starts) on, cut at every change point and around every (t0, t1, ...) span of `cuts`; what runs
    after a cut is whatever was active before it unless a change says otherwise."""
    if not math.isfinite(tl.t_first):
        return []
    points = change_points(tl)
    key = setting_key(start_active)
    if points and points[0][2] == EventKind.SERVER_INFO and points[0][0] <= tl.t_first + FIRST_INFO_S:
        key = points[0][1]
    runs: list[tuple[float, tuple, str]] = [(tl.t_first, key, START)]
    for t, k, src in points:
        if k != runs[-1][1]:
            runs.append((max(t, tl.t_first), k, src))
    gone = [(c[0], c[1]) for c in cuts]
    segs: list[Segment] = []
    for i, (t0, k, src) in enumerate(runs):
        t1 = runs[i + 1][0] if i + 1 < len(runs) else tl.t_last
        for j, (a, b) in enumerate(_minus((t0, t1), gone)):
            if b > a:
                segs.append(Segment(k, a, b, src if j == 0 and a == t0 else RESUMED))
    return segs


def _minus(span: tuple[float, float], cuts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`span` less each [g0, g1) of `cuts`, in order; a zero-length cut inside it splits it in two
    (one at its very start leaves it whole)."""
    pieces = [span]
    for g0, g1 in cuts:
        nxt = []
        for a, b in pieces:
            if g1 <= a or g0 >= b or (g0 == g1 == a):
                nxt.append((a, b))
                continue
            if a < g0:
                nxt.append((a, g0))
            if g1 < b:
                nxt.append((g1, b))
        pieces = nxt
    return pieces
