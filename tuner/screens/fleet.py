"""The fleet screen: one row per server (name, state, setting, tok/s, τ, draft-collective share,
GPU activity, HTTP errors, sample age), an aggregate row, sort keys, a selection, and a setting
change sent to the selected servers (or the one under the cursor) after a confirmation, each
server's outcome shown below the table.

It reads only `FleetPoller.rows()` (never blocks on a server) and changes only through
`tuner.fleet.change.apply_to_fleet` on a worker thread. `enter` hands the server under the cursor
to the app (`FleetApp` exits with its name; `attach` then opens today's single-server view on it
and comes back here when it closes). Must not talk HTTP itself.
"""

from __future__ import annotations

from typing import Any, Iterable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Static

from probes.names import STEPS
from tuner.fleet.change import APPLIED, apply_to_fleet
from tuner.fleet.rows import COLUMNS, SORT_KEYS, aggregate, aggregate_cells, row_cells, sort_rows
from tuner.screens.modal import ModalBox

REFRESH_S = 0.25
STATE_WIDTH = 60          # the state column's cut; the row under the cursor shows all of it below
STATE_STYLE = {"connected": "green", "degraded": "yellow", "gone": "red", "refused": "red", "connecting": "dim"}


class FleetConfirm(ModalBox[bool]):
    """Dismissed with True (send the change) or False."""

    BINDINGS = [Binding("y,enter", "answer(True)", "send"), Binding("n,escape", "answer(False)", "cancel")]
    DEFAULT_CSS = "FleetConfirm > .box { width: 80%; height: auto; border: round $warning; }"
    SCROLLS = False
    BOX_TITLE = "change the fleet's setting?"

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def body(self) -> Iterable[Widget]:
        yield Static(Text(self.question, style="bold"))
        yield Static(Text.assemble(("y", "bold"), " / enter: send    ", ("n", "bold"), " / esc: cancel"))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class FleetScreen(Screen[None]):
    """The fleet's rows over a started FleetPoller."""

    BINDINGS = [
        Binding("o", "sort", "sort"),
        Binding("O", "reverse", "reverse"),
        Binding("space", "select", "select"),
        Binding("a", "select_all", "all"),
        Binding("plus,equals_sign", "steps(1)", "steps +1"),
        Binding("minus", "steps(-1)", "steps -1"),
        Binding("enter", "open", "open"),
        Binding("q", "app.quit", "quit"),
    ]
    DEFAULT_CSS = """
    FleetScreen #fleet-table { height: 1fr; }
    FleetScreen #fleet-outcome { height: auto; max-height: 8; color: $text-muted; }
    """

    def __init__(self, poller: Any) -> None:
        super().__init__()
        self.poller = poller
        self.sort_key = "name"
        self.reverse = False
        self.selected: set[str] = set()
        self.order: list[str] = []
        self.outcome = ""

    def compose(self) -> ComposeResult:
        table = DataTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(" ", *COLUMNS)
        yield table
        yield Static("", id="fleet-outcome")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_rows()
        self.set_interval(REFRESH_S, self.refresh_rows)

    # -- drawing --------------------------------------------------------------------------------------

    def refresh_rows(self) -> None:
        rows = sort_rows(self.poller.rows(), self.sort_key, self.reverse)
        table = self.query_one("#fleet-table", DataTable)
        cursor = table.cursor_row
        table.clear()
        self.order = [r.name for r in rows]
        for r in rows:
            cells = list(row_cells(r))
            cells[1] = Text(cells[1][:STATE_WIDTH], style=STATE_STYLE.get(r.state, ""))
            table.add_row("*" if r.name in self.selected else " ", *cells, key=r.name)
        table.add_row(" ", *(Text(c, style="bold") for c in aggregate_cells(aggregate(rows))), key="__all__")
        if rows:
            table.move_cursor(row=min(max(cursor, 0), len(rows) - 1))
        order = f"sorted by {self.sort_key}{' (reversed)' if self.reverse else ''}"
        picked = f" · {len(self.selected)} selected" if self.selected else ""
        # The overlays' problems (Prometheus down, DCGM series left out) stay in view while they last.
        notes = "".join(f"\n{n}" for n in self.poller.notes()) if hasattr(self.poller, "notes") else ""
        # The row under the cursor whose state the column cut: all of its reason.
        here = next((r for r in rows if r.name == self.current()), None)
        if here is not None and len(here.state_text) > STATE_WIDTH:
            notes += f"\n{here.name}: {here.state_text}"
        self.query_one("#fleet-outcome", Static).update(Text(f"{order}{picked}{notes}\n{self.outcome}".rstrip()))

    # -- keys ------------------------------------------------------------------------------------------

    def current(self) -> str | None:
        row = self.query_one("#fleet-table", DataTable).cursor_row
        return self.order[row] if 0 <= row < len(self.order) else None

    def action_sort(self) -> None:
        self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
        self.refresh_rows()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.refresh_rows()

    def action_select(self) -> None:
        name = self.current()
        if name is not None:
            self.selected ^= {name}
            self.refresh_rows()

    def action_select_all(self) -> None:
        self.selected = set() if self.selected == set(self.order) else set(self.order)
        self.refresh_rows()

    def targets(self) -> list[str]:
        """The selected servers, else the one under the cursor."""
        if self.selected:
            return [n for n in self.order if n in self.selected]
        name = self.current()
        return [name] if name else []

    def action_steps(self, delta: int) -> None:
        names = self.targets()
        rows = {r.name: r for r in self.poller.rows()}
        changes = {}
        for n in names:
            steps = rows[n].setting.get(STEPS) if n in rows else None
            if isinstance(steps, int) and steps + delta >= 1:
                changes[n] = steps + delta
        if not changes:
            self.outcome = "no connected server with a step count to change among " + (", ".join(names) or "none")
            self.refresh_rows()
            return
        question = "Set " + ", ".join(f"{n}: steps {rows[n].setting.get(STEPS)} → {v}" for n, v in changes.items()) + "?"
        self.app.push_screen(FleetConfirm(question), lambda yes: self.send(changes) if yes else None)

    @work(thread=True, exclusive=True, group="fleet-change")
    def send(self, changes: dict[str, int]) -> None:
        sessions = self.poller.sessions()
        outcomes = {}
        for value in sorted(set(changes.values())):
            group = {n: sessions[n] for n, v in changes.items() if v == value and n in sessions}
            outcomes.update(apply_to_fleet(group, {STEPS: value}, by="fleet"))
        for n in changes:
            if n not in sessions:
                outcomes[n] = None
        text = "  ".join(f"{n}: {o.text if o is not None else 'refused (not connected)'}" for n, o in outcomes.items())
        ok = all(o is not None and o.status == APPLIED for o in outcomes.values())
        self.app.call_from_thread(self._show_outcome, ("all applied · " if ok else "") + text)

    def _show_outcome(self, text: str) -> None:
        self.outcome = text
        self.refresh_rows()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        # enter on the table (which has the focus) arrives as its RowSelected
        event.stop()
        self.action_open()

    class Open(Message):
        """The server the user chose to open in the single-server view (the app decides how)."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def action_open(self) -> None:
        name = self.current()
        if name is not None:
            self.post_message(self.Open(name))      # up to the app: the screen reads no app attribute


class FleetApp(App[str | None]):
    """The fleet screen as an app: exits with the name of the server to open, or None to quit."""

    TITLE = "specdecode-tune · fleet"

    def __init__(self, poller: Any) -> None:
        super().__init__()
        self.poller = poller

    def on_mount(self) -> None:
        self.push_screen(FleetScreen(self.poller))

    def on_fleet_screen_open(self, message: FleetScreen.Open) -> None:
        self.exit(message.name)
