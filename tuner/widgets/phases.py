"""Where one decode iteration's time goes: a stacked bar and a table of ms per iteration and %.

Phase times from the engine are inclusive of their collectives, so each phase is drawn as two
disjoint segments, compute (phase - comm) and collectives (comm); a phase and its comm part are
never stacked on top of each other. Idle is wall minus the phases. A phase whose collectives ran
inside CUDA graphs has no comm time (NaN: events cannot time them one by one); its collectives row
says so instead of showing 0, and only a captured trace times them. This widget only draws the
numbers it is given; averaging over a window is the store's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from probes.names import ALL_PHASES as PHASES
from probes.names import DRAFT, DRAFT_EXTEND, OTHER, PREFILL, VERIFY, VERIFY_SAMPLE
from tuner.widgets.fmt import is_num, num
from tuner.widgets.view_widget import ViewWidget



@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    color: str
    glyph: str


# Collectives share their phase's colour with a lighter texture, so "how much of the draft is
# allreduce" reads as the textured part of the draft's colour.
SEGMENTS = (
    Segment(PREFILL, "prefill", "#e07a5f", "█"),
    Segment("draft", "draft", "#4fb3d9", "█"),
    Segment("draft_comm", "draft collectives", "#4fb3d9", "▒"),
    Segment("verify", "verify", "#8bc34a", "█"),
    Segment("verify_comm", "verify collectives", "#8bc34a", "▒"),
    Segment("verify_sample", "accept + commit", "#e0b040", "█"),
    Segment("draft_extend", "draft extend", "#b38cd9", "█"),
    Segment("draft_extend_comm", "extend collectives", "#b38cd9", "▒"),
    Segment("idle", "other / idle", "#6b6b6b", "░"),
)


COMPACT_LABELS = {"verify_sample": "accept", "draft_extend": "extend", "idle": "other/idle"}
"""Shorter row labels of the compact split (its collectives share the line, so "draft extend"
reads as "extend")."""


@dataclass(frozen=True)
class PhaseView:
    """Mean ms per decode iteration over the window the panel shows."""

    phase_ms: dict[str, float] = field(default_factory=dict)
    comm_ms: dict[str, float] = field(default_factory=dict)
    wall_ms: float = float("nan")
    iterations: int = 0
    window_s: float = 10.0
    unavailable: str = ""
    """Why there are no phase timers (e.g. an SGLang server without our plugin), or ""."""


def segment_ms(view: PhaseView) -> dict[str, float]:
    """Disjoint parts of the iteration; they add up to the wall time."""
    p, c = view.phase_ms, view.comm_ms

    def get(d: dict[str, float], k: str) -> float:
        v = d.get(k, 0.0)
        return v if is_num(v) else 0.0

    out = {
        # Prefill's collectives stay inside it (see the module docstring).
        PREFILL: get(p, PREFILL),
        "draft": max(0.0, get(p, DRAFT) - get(c, DRAFT)),
        "draft_comm": get(c, DRAFT),
        "verify": max(0.0, get(p, VERIFY) - get(c, VERIFY)),
        "verify_comm": get(c, VERIFY),
        # Acceptance and commit rarely talk to other ranks; its collectives stay inside it.
        "verify_sample": get(p, VERIFY_SAMPLE),
        "draft_extend": max(0.0, get(p, DRAFT_EXTEND) - get(c, DRAFT_EXTEND)),
        "draft_extend_comm": get(c, DRAFT_EXTEND),
    }
    work = sum(get(p, k) for k in PHASES)
    wall = view.wall_ms if is_num(view.wall_ms) else work
    out["idle"] = get(p, OTHER) + max(0.0, wall - work)
    return out


def untimed_comm(view: PhaseView) -> tuple[str, ...]:
    """Phases that ran but whose collectives have no time (inside CUDA graphs, or a server that
    cannot see them): their comm parts are unknown, not 0."""
    return tuple(p for p in (DRAFT, VERIFY, DRAFT_EXTEND)
                 if is_num(view.phase_ms.get(p, float("nan"))) and view.phase_ms[p] > 0
                 and not is_num(view.comm_ms.get(p, float("nan"))))


def stacked_bar(parts: dict[str, float], width: int) -> Text:
    """One line: each segment gets cells in proportion to its time (largest remainder rounding)."""
    total = sum(parts.values())
    text = Text()
    if total <= 0 or width <= 0:
        return Text("·" * max(width, 0), style="dim")
    exact = [(s, parts.get(s.key, 0.0) / total * width) for s in SEGMENTS]
    cells = {s.key: int(x) for s, x in exact}
    short = width - sum(cells.values())
    for s, x in sorted(exact, key=lambda e: e[1] - int(e[1]), reverse=True)[:short]:
        cells[s.key] += 1
    for s in SEGMENTS:
        text.append(s.glyph * cells[s.key], style=s.color)
    # One line whatever width it is measured at (the widget's width of the last layout can differ).
    text.no_wrap, text.overflow = True, "crop"
    return text


class PhaseSplit(ViewWidget[PhaseView]):
    """The phase panel; call `show(view)` with fresh numbers."""

    VIEW = PhaseView
    _compact = False

    @property
    def compact(self) -> bool:
        """Each phase's collectives on the phase's own line (6 rows instead of 9): a short terminal."""
        return self._compact

    @compact.setter
    def compact(self, value: bool) -> None:
        if value != self._compact:
            self._compact = value
            self.refresh(layout=True)

    def shape(self, v: PhaseView) -> tuple:
        return (bool(v.unavailable), v.iterations == 0)

    def render(self) -> Group | Text:
        view = self._view
        if view.unavailable:
            return Text(view.unavailable, style="italic dim")
        if view.iterations == 0:
            return Text("waiting for decode iterations…", style="dim")
        parts = segment_ms(view)
        total = sum(parts.values()) or 1.0
        width = max(10, self.content_size.width)
        if self._compact:
            return self._render_compact(view, parts, total, width)
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(ratio=1)
        table.add_column(justify="right", width=8)
        table.add_column(justify="right", width=6)
        untimed = {f"{p}_comm" for p in untimed_comm(view)}
        for s in SEGMENTS:
            ms = parts[s.key]
            label = Text(s.glyph + " ", style=s.color) + Text(s.label, style="" if ms > 0 else "dim")
            if s.key in untimed:
                table.add_row(label, Text("in graph", style="dim"), Text("—", style="dim"))
                continue
            table.add_row(label, num(ms, 2), f"{ms / total * 100:.1f}%")
        comm = parts["draft_comm"] + parts["verify_comm"] + parts["draft_extend_comm"]
        table.add_row(Text("iteration", style="bold"), Text(num(total, 2), style="bold"),
                      Text("100%", style="bold"))
        tail = (f" · {view.iterations} iters, last {view.window_s:.0f} s", "dim")
        if untimed:
            # Inside a graph the phase time includes them; their own share needs a trace.
            foot = Text.assemble(("collectives ", "dim"), ("inside CUDA graphs", "bold"),
                                 (" · c times them\n", "dim"), (tail[0].removeprefix(" · "), "dim"))
        else:
            foot = Text.assemble(("collectives ", "dim"), (f"{comm / total * 100:.1f}%", "bold"), tail)
        return Group(stacked_bar(parts, width), table, foot)

    def _render_compact(self, view: PhaseView, parts: dict[str, float], total: float, width: int) -> Group:
        """The bar, then one line per phase with its collectives beside it, then the totals."""
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(ratio=1, no_wrap=True)
        for w in (6, 5, 7, 4):
            table.add_column(justify="right", width=w, no_wrap=True)
        untimed = {f"{p}_comm" for p in untimed_comm(view)}
        by_key = {s.key: s for s in SEGMENTS}
        for s in SEGMENTS:
            if s.key.endswith("_comm"):
                continue
            ms = parts[s.key]
            label = Text(s.glyph + " ", style=s.color) + Text(COMPACT_LABELS.get(s.key, s.label),
                                                              style="" if ms > 0 else "dim")
            row: list = [label, num(ms, 2), f"{ms / total * 100:.1f}%"]
            comm = by_key.get(f"{s.key}_comm")
            if comm is not None and comm.key in untimed:
                row += [Text("▒ in graph", style=comm.color), ""]
            elif comm is not None:
                cms = parts[comm.key]
                row += [Text.assemble((comm.glyph + " ", comm.color), num(cms, 2 if cms < 100 else 1)),
                        f"{cms / total * 100:.0f}%"]
            table.add_row(*row)
        comm = parts["draft_comm"] + parts["verify_comm"] + parts["draft_extend_comm"]
        foot = Text.assemble(("iteration ", "bold"), (f"{num(total, 2)} ms", "bold"), (" · ▒ ", "dim"),
                             ("in graphs" if untimed else f"{comm / total * 100:.1f}%", "bold"),
                             (f" · {view.iterations} iters", "dim"))
        foot.no_wrap, foot.overflow = True, "ellipsis"
        return Group(stacked_bar(parts, width), table, foot)
