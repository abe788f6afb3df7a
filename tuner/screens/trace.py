"""The analysis of one trace capture: per rank, mean ms per iteration in each phase and its
collectives, with the skew across ranks per iteration (the analysis sums it over the aligned
iterations; the table's unit is per iteration).

Reads the instruments' analysis dict (probes/trace_result.py, `TraceAnalysis.to_dict()`) as given;
it must not re-analyse anything.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Static

from probes.names import DRAFT, DRAFT_EXTEND, OTHER, PREFILL, VERIFY, VERIFY_SAMPLE
from tuner.screens.modal import ModalPanel
from tuner.widgets.phases import SEGMENTS, PhaseView, segment_ms, stacked_bar

PHASE_LABEL = {PREFILL: "prefill", DRAFT: "draft", VERIFY: "verify", VERIFY_SAMPLE: "accept + commit",
               DRAFT_EXTEND: "draft extend", OTHER: "other"}


def _f(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "n/a"


def analysis_table(analysis: Mapping[str, Any]) -> Table:
    """Rows: phases (work, of it collectives) then wall/busy/idle; columns: ranks, then skew."""
    ranks = list(analysis.get("ranks") or [])
    across = analysis.get("across") or {}
    skew = across.get("phases") or {}
    table = Table(box=None, padding=(0, 2), header_style="bold", expand=False)
    table.add_column("ms per iteration")
    for r in ranks:
        table.add_column(f"rank {r.get('rank', '?')}", justify="right")
        table.add_column("comm", justify="right", style="dim")
    if across:
        table.add_column("skew", justify="right")
        table.add_column("slowest", justify="right", style="dim")
    phases = list(analysis.get("phases") or PHASE_LABEL)
    for n, phase in enumerate(phases):
        row: list[Any] = [PHASE_LABEL.get(phase, phase)]
        for r in ranks:
            p = ((r.get("mean") or {}).get("phases") or {}).get(phase) or {}
            row += [_f(p.get("ms")), _f(p.get("comm_ms"))]
        if across:
            s = skew.get(phase) or {}
            row += [_f(per_iteration(s.get("skew_ms"), across)), str(s.get("slowest_rank", ""))]
        table.add_row(*row, end_section=n == len(phases) - 1)
    for key, label in (("wall_ms", "wall"), ("busy_ms", "busy"), ("comm_ms", "collectives"), ("idle_ms", "idle")):
        row = [label]
        for r in ranks:
            row += [_f((r.get("mean") or {}).get(key)), ""]
        if across:
            row += ["", ""]
        table.add_row(*row, style="bold")
    return table


def per_iteration(total: Any, across: Mapping[str, Any]) -> float | None:
    """A cross-rank figure the analysis sums over the aligned iterations, per iteration (the table's
    unit); None when either is missing."""
    n = across.get("aligned_iterations")
    if not isinstance(total, (int, float)) or not isinstance(n, int) or n <= 0:
        return None
    return total / n


def rank_bars(analysis: Mapping[str, Any], width: int = 72) -> Group:
    """One stacked bar per rank, as in the main screen's phase panel (work █, collectives ▒, idle ░),
    all on one scale so a slow rank's bar is longer."""
    rows = []
    for r in analysis.get("ranks") or []:
        mean = r.get("mean") or {}
        phases = mean.get("phases") or {}
        view = PhaseView(phase_ms={p: (v or {}).get("ms", 0.0) for p, v in phases.items()},
                         comm_ms={p: (v or {}).get("comm_ms", 0.0) for p, v in phases.items()},
                         wall_ms=mean.get("wall_ms") or float("nan"), iterations=1)
        parts = segment_ms(view)
        rows.append((r.get("rank", "?"), parts, sum(parts.values())))
    longest = max((total for _, _, total in rows), default=0.0) or 1.0
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True, min_width=6)
    table.add_column(no_wrap=True, min_width=width)
    table.add_column(justify="right", no_wrap=True, min_width=10)
    for rank, parts, total in rows:
        table.add_row(f"rank {rank}", stacked_bar(parts, max(1, round(total / longest * width))),
                      f"{_f(total)} ms")
    legend = Text()
    for seg in SEGMENTS:
        legend.append(seg.glyph, style=seg.color)
        legend.append(f" {seg.label}   ", style="dim")
    return Group(table, legend)


def summary(analysis: Mapping[str, Any]) -> Text:
    ranks = analysis.get("ranks") or []
    n_iter = max((len(r.get("iterations") or []) for r in ranks), default=0)
    text = Text.assemble(
        ("mode ", "dim"), (str(analysis.get("mode", "?")), "bold"),
        ("  ·  ranks ", "dim"), (str(len(ranks)), "bold"),
        ("  ·  iterations ", "dim"), (str(n_iter), "bold"))
    across = analysis.get("across")
    if across:
        text.append("  ·  slowest rank ", style="dim")
        text.append(str(across.get("slowest_rank", "?")), style="bold")
        text.append("  ·  skew ", style="dim")
        text.append(f"{_f(per_iteration(across.get('skew_ms'), across))} ms", style="bold")
        text.append(f" per iteration ({_f(across.get('skew_ms'))} ms over {across.get('aligned_iterations', '?')})",
                    style="dim")
    if analysis.get("mode") == "cpu":
        text.append("\nCPU trace: work is the top-level CPU ops inside the phase spans on the engine "
                    "thread; collectives are the communicator's spans.", style="dim italic")
    for w in analysis.get("warnings") or ():
        text.append(f"\n▲ {w}", style="#e0b040")
    return text


class TraceScreen(ModalPanel["tuple[str, Any] | None"]):
    """Dismissed with (knob, value) when the operator asks for the relaunch it offers, else None.

    Args:
        relaunch: this face can relaunch the server (managed mode, live): r offers it.
    """

    BINDINGS = [Binding("r", "pcie_relaunch", "relaunch with PCIe-IPC all-reduce", show=False)]
    DEFAULT_CSS = """
    TraceScreen #trace-summary { margin-bottom: 1; }
    TraceScreen #trace-bars { margin-top: 1; }
    TraceScreen #trace-remedies { margin-top: 1; }
    """

    def __init__(self, analysis: Mapping[str, Any], title: str = "trace analysis", *, relaunch: bool = False) -> None:
        super().__init__()
        self.analysis = analysis
        self.title_text = title
        self.relaunch = relaunch

    def body(self) -> Iterable[Widget]:
        yield Static(summary(self.analysis), id="trace-summary")
        yield Static(analysis_table(self.analysis), id="trace-table")
        yield Static(rank_bars(self.analysis), id="trace-bars")
        remedies = self._remedies()
        box = Static(remedies, id="trace-remedies")
        box.display = bool(remedies.plain)       # nothing to say: no line at all
        yield box

    def _remedies(self) -> Text:
        """What the server lets the operator change about its collectives, predicted from this
        capture (tuner.tuning.comm_whatif, the words every face uses)."""
        from probes.names import STEPS
        from tuner.core import series as S
        from tuner.tuning.comm_whatif import PCIE_IPC_ENV, pcie_ipc_offer, remedies_for

        session = getattr(self.app, "session", None)
        if session is None:
            return Text("")
        batch = session.store.latest(S.SERVER_BATCH)
        backend = session.backend
        pin = backend.capabilities.allowed_values(STEPS) if backend is not None else None
        info = session.server_info()
        lines = remedies_for(info, self.analysis, batch.value if batch else None, pin)
        if not lines:
            return Text("")
        if pcie_ipc_offer(info):
            lines.append("r: relaunch with it (a server `specdecode-tune launch` owns)"
                         if self.relaunch else
                         f"to apply: relaunch the server with {PCIE_IPC_ENV}=1 in its environment "
                         f"(or `specdecode-tune launch --try {PCIE_IPC_ENV}=1 -- …`)")
        return Text("what this server lets you change\n", style="bold") + Text("\n".join(lines))

    def action_pcie_relaunch(self) -> None:
        from tuner.tuning.comm_whatif import PCIE_IPC_ENV, pcie_ipc_offer

        session = getattr(self.app, "session", None)
        if session is None or not pcie_ipc_offer(session.server_info()):
            self.notify("the plugin does not report NCCL on a PCIe-only TP group here", severity="warning")
            return
        if not self.relaunch:
            self.notify(f"only a server `specdecode-tune launch` owns can be relaunched from here: set "
                        f"{PCIE_IPC_ENV}=1 in the server's environment and relaunch it", severity="warning")
            return
        self.dismiss((PCIE_IPC_ENV, 1))     # the app offers the relaunch

    def box_title(self) -> str:
        return self.title_text
