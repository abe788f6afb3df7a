"""Top functions of the server's Python processes, from one py-spy sampling run.

Shows the instruments' py-spy result as given (probes' parser does the counting); it must not run
py-spy or parse its output itself.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rich.table import Table
from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from tuner.screens.modal import ModalPanel


def _get(row: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        if isinstance(row, Mapping) and n in row:
            return row[n]
        if hasattr(row, n):
            return getattr(row, n)
    return default


def _pct(x: Any) -> str:
    return f"{x:5.1f}%" if isinstance(x, (int, float)) and x == x else "  n/a"


def functions_table(result: Any, limit: int = 40) -> Table:
    rows = list(_get(result, "functions", "top", default=[]) or [])[:limit]
    table = Table(box=None, padding=(0, 2), header_style="bold", expand=True)
    table.add_column("own", justify="right")
    table.add_column("total", justify="right")
    table.add_column("function", no_wrap=True, ratio=1)
    table.add_column("where", style="dim", no_wrap=True, overflow="ellipsis", ratio=1)
    for row in rows:
        where = _get(row, "where", default=None)
        if where is None:
            file, line = _get(row, "file", "filename", default=""), _get(row, "line", "lineno", default="")
            where = f"{file}:{line}" if line not in ("", None) else str(file)
        table.add_row(_pct(_get(row, "own_pct", "self_pct", "own")), _pct(_get(row, "total_pct", "total")),
                      str(_get(row, "function", "name", default="?")), str(where))
    return table


def summary(result: Any) -> Text:
    procs = list(_get(result, "processes", "pids", default=[]) or [])
    samples = _get(result, "samples", "total_samples", default=None)
    duration = _get(result, "duration_s", "seconds", default=None)
    text = Text.assemble(("processes ", "dim"), (str(len(procs)), "bold"))
    if samples is not None:
        text.append("  ·  samples ", style="dim")
        text.append(str(samples), style="bold")
    if isinstance(duration, (int, float)):
        text.append("  ·  over ", style="dim")
        text.append(f"{duration:.1f} s", style="bold")
    for proc in procs:
        if not hasattr(proc, "pid") and not isinstance(proc, Mapping):
            continue
        text.append(f"\npid {_get(proc, 'pid', default='?')}: ", style="bold")
        error = _get(proc, "error", default=None)
        if error:
            text.append(str(error), style="#d96e6e")
            continue
        text.append(f"idle {_pct(_get(proc, 'idle_pct')).strip()} of thread samples · "
                    f"GIL held {_pct(_get(proc, 'gil_pct')).strip()} of ticks · "
                    f"{_get(proc, 'samples', default='?')} active samples", style="dim")
    text.append("\nown: the function itself is on top of the stack; total: anywhere on the stack",
                style="dim italic")
    for w in _get(result, "warnings", default=()) or ():
        text.append(f"\n▲ {w}", style="#e0b040")
    return text


class PySpyScreen(ModalPanel):
    DEFAULT_CSS = "PySpyScreen #pyspy-summary { margin-bottom: 1; }"
    BOX_TITLE = "py-spy: top functions of the server's processes"

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result

    def body(self) -> Iterable[Widget]:
        yield Static(summary(self.result), id="pyspy-summary")
        yield Static(functions_table(self.result), id="pyspy-table")
