"""The tune screen: the live tuner's progress, its table of settings (predicted tok/s ± uncertainty
vs measured), the fitted costs in brief, the A/B verdicts, and a key to apply a setting.

The app drives the tuner (`Tuner.step()` on its tick, before `session.tick()`) and calls
`refresh_view()` while this screen is up; the screen only draws a `TuneView` (tuner.widgets.
tune_view) and turns keys into `Tuner.apply` / `Tuner.cancel`. On a replay it shows the recorded
tuning read-only. Closing the screen dismisses it: the app, told by the dismissal, cancels the tuner
(which then puts the best verified setting back) and closes it. It reads nothing of the app but the
session.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Mapping

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static

from tuner.tuning.live import State
from tuner.tuning.settings import Setting
from tuner.tuning.what_if_now import active_setting
from tuner.widgets.fmt import is_num, num
from tuner.widgets.tune_view import TuneRow, TuneView, build_view, live_doc

COLUMNS = (("", 3), ("setting", 22), ("predicted tok/s", 16), ("τ", 5), ("measured", 9), ("basis / note", 30))
# Under a latency objective or an SLO: the ITL each setting is predicted and measured at, in ms, and
# whether it meets the SLO; the note column gives up the room (the table fits 120 columns).
LATENCY_COLUMNS = (("ITL pred.", 11), ("ITL meas.", 9), ("SLO", 6))
NOTE_WIDTH_WITH_LATENCY = 18
BASIS_STYLE = {"measured": "#8bc34a", "fitted": "", "extrapolated": "#e0b040", "what-if": "#b38cd9"}
MEETS = {True: Text("meets", style="#8bc34a"), False: Text("misses", style="bold #d96e6e"), None: Text("")}


def columns(latency: bool) -> tuple[tuple[str, int], ...]:
    if not latency:
        return COLUMNS
    *head, (note, _) = COLUMNS
    return (*head, *LATENCY_COLUMNS, (note, NOTE_WIDTH_WITH_LATENCY))


def row_cells(row: TuneRow, latency: bool = False) -> tuple[Any, ...]:
    pred = (Text(f"{row.predicted:.1f} ± {row.sd:.1f}", style="bold" if "★" in row.marks else "")
            if is_num(row.predicted) else Text("—", style="dim"))
    note = Text(row.basis, style=BASIS_STYLE.get(row.basis, ""))
    if row.note:
        note.append((" · " if row.basis else "") + row.note, style="dim")
    head = (Text(row.marks, style="bold #e0b040"), row.label, pred, num(row.tau, 2), num(row.measured))
    if not latency:
        return (*head, note)
    itl = (Text(f"{row.itl * 1e3:.1f} ± {row.itl_sd * 1e3:.1f}" if is_num(row.itl_sd) else f"{row.itl * 1e3:.1f}")
           if is_num(row.itl) else Text("—", style="dim"))
    meas = Text(f"{row.itl_measured * 1e3:.1f}", style="" if row.meets is not False else "bold #d96e6e") \
        if is_num(row.itl_measured) else Text("—", style="dim")
    return (*head, itl, meas, MEETS[row.meets], note)


class TuneTable(DataTable):
    """The settings table; `picked` turns True once the operator moves the cursor, from then on the
    cursor follows that setting when the rows re-sort (before that it stays on the best row)."""

    picked = False

    def _pick(self) -> None:
        self.picked = True

    def action_cursor_up(self) -> None:
        self._pick()
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self._pick()
        super().action_cursor_down()

    def action_page_up(self) -> None:
        self._pick()
        super().action_page_up()

    def action_page_down(self) -> None:
        self._pick()
        super().action_page_down()

    def action_scroll_top(self) -> None:
        self._pick()
        super().action_scroll_top()

    def action_scroll_bottom(self) -> None:
        self._pick()
        super().action_scroll_bottom()

    async def _on_click(self, event: events.Click) -> None:
        self._pick()
        await super()._on_click(event)


class TuneScreen(Screen[None]):
    """Either `tuner` (live) or `recorded` ((result-shaped dict, state)) is given."""

    BINDINGS = [
        Binding("enter", "apply", "apply selected", priority=True),
        Binding("s", "stop", "stop tuning"),
        Binding("escape,q,u", "close", "close", key_display="esc"),
    ]
    DEFAULT_CSS = """
    TuneScreen { layout: vertical; }
    TuneScreen #tune-top { height: auto; padding: 0 1; border: round $accent; }
    TuneScreen #tune-status { height: auto; }
    TuneScreen #tune-progress { height: 1; margin-top: 1; }
    TuneScreen #tune-table { height: 1fr; min-height: 6; }
    TuneScreen #tune-notes { height: auto; max-height: 14; padding: 0 1; border: round $panel-lighten-2; }
    """

    def __init__(self, tuner: Any = None, recorded: tuple[Mapping[str, Any], str] | None = None) -> None:
        super().__init__()
        self.tuner = tuner
        self.recorded = recorded
        self.view = TuneView()
        self._model: tuple[int, Any] = (0, None)
        self._applying: tuple[str, Future] | None = None
        # Pushed is not mounted: the app's timer can tick in between, before the panels exist.
        self._mounted = False
        self.latency = False
        """The table has the latency columns: the tuning judges an objective other than tok/s (set
        in compose: nothing of the tuner is read before the screen mounts)."""

    def compose(self) -> ComposeResult:
        objective = self.tuner.opts.objective if self.tuner is not None else None
        self.latency = (not objective.plain) if objective is not None else \
            bool(self.recorded and self.recorded[0].get("objective"))
        with Vertical(id="tune-top"):
            yield Static(id="tune-status")
            yield ProgressBar(id="tune-progress", total=100, show_eta=False)
        table = TuneTable(id="tune-table", cursor_type="row", zebra_stripes=True)
        for name, width in columns(self.latency):
            table.add_column(name, width=width, key=name or "marks")
        yield table
        yield Static(id="tune-notes")
        yield Footer()

    def on_mount(self) -> None:
        self._mounted = True
        top = self.query_one("#tune-top")
        if self.tuner is not None:
            top.border_title = "tune · live"
            budget = getattr(getattr(self.tuner, "opts", None), "budget_s", None)
            top.border_subtitle = (f"budget {budget:.0f} s · " if budget else "") + \
                f"{len(self.tuner.space)} settings · enter applies the selected row"
        else:
            top.border_title = "tune · recorded (read-only)"
            top.border_subtitle = "esc closes"
        self.query_one("#tune-notes").border_title = "A/B and fitted costs"
        self.refresh_view()
        self.query_one(DataTable).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply":
            return self.tuner is not None
        if action == "stop":
            return self.tuner is not None and self.tuner.state == State.RUNNING
        return True

    # -- drawing ------------------------------------------------------------------------------

    def build(self) -> TuneView:
        if self.tuner is None:
            doc, state = self.recorded or ({}, "none")
            return build_view(doc, state=state, stage="recorded", status=f"recorded tuning ({state})",
                              progress=1.0, read_only=True)
        t = self.tuner
        model = t.model
        if model is not None and id(model) != self._model[0]:
            self._model = (id(model), model.to_json())
        doc = live_doc(t, self._model[1])
        # "Running now" is what the server reports, not what the tuner believes it asked for.
        current = active_setting(self.app.session.active_config())
        return build_view(doc, state=t.state, stage=t.stage, status=t.status, progress=t.progress(),
                          current=current.to_json() if current is not None else None,
                          space=[s.to_json() for s in t.space])

    def refresh_view(self) -> None:
        """Redraw from the tuner (live) or the recording; only what changed (nothing before mount)."""
        if not self._mounted:
            return
        self._check_apply()
        view = self.build()
        if view == self.view:
            return
        old, self.view = self.view, view
        if view.state != old.state:
            self.refresh_bindings()     # "stop" only while tuning runs
        state = {"running": "[b #e0b040]tuning[/]", "done": "[b #8bc34a]done[/]",
                 "failed": "[b #d96e6e]failed[/]"}.get(view.state, f"[b]{view.state}[/]")
        stage = f" · {view.stage}" if view.stage and view.stage != view.state else ""
        lines = [state + stage + (f" · bs {view.bs}" if view.bs else ""),
                 f"[dim]{Text(view.status).markup}[/]" if view.status else ""]
        if view.result:
            lines.append(Text(view.result).markup)
        self.query_one("#tune-status", Static).update("\n".join(x for x in lines if x))
        self.query_one("#tune-progress", ProgressBar).update(progress=round(view.progress * 100, 1))
        if view.rows != old.rows:
            self._fill_table(view.rows)
        notes = [*view.objective, *(f"A/B {v}" for v in view.verifications), *view.costs]
        self.query_one("#tune-notes", Static).update(
            "\n".join(Text(n).markup for n in notes) if notes else
            "[dim]the fitted costs appear after the first probes[/]")

    def _fill_table(self, rows: tuple[TuneRow, ...]) -> None:
        table = self.query_one(TuneTable)
        selected = self.selected() if table.picked else None
        table.clear()
        for row in rows:
            table.add_row(*row_cells(row, self.latency), key=repr(row.key))
        if selected is not None:
            for i, row in enumerate(rows):
                if row.key == selected.key:
                    table.move_cursor(row=i, animate=False)
                    break

    def selected(self) -> TuneRow | None:
        table = self.query_one(DataTable)
        rows = self.view.rows
        if not table.row_count or not (0 <= table.cursor_row < table.row_count):
            return None
        key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        return next((r for r in rows if repr(r.key) == key), None)

    # -- keys ---------------------------------------------------------------------------------

    def action_apply(self) -> None:
        row = self.selected()
        if self.tuner is None or row is None:
            return
        if self.tuner.state == State.RUNNING:
            self.notify("tuning is still running: press s to stop it (the best verified setting stays), "
                        "then apply", severity="warning")
            return
        if self._applying is not None:
            self.notify("a change is already on its way", severity="warning")
            return
        try:
            setting = Setting.from_json(dict(row.setting))
        except (KeyError, TypeError, ValueError) as e:
            self.notify(f"cannot apply {row.label}: {e}", severity="error")
            return
        self._applying = (row.label, self.tuner.apply(setting))
        self.notify(f"applying {row.label}…")

    def _check_apply(self) -> None:
        if self._applying is None or not self._applying[1].done():
            return
        what, fut = self._applying
        self._applying = None
        try:
            res = fut.result()
            ok, reason = bool(getattr(res, "ok", res)), str(getattr(res, "reason", "") or "")
        except Exception as e:   # a dead server is a message here, never the end of the app
            ok, reason = False, f"{type(e).__name__}: {e}"
        if ok:
            self.notify(f"the server runs {what}", title="applied")
        else:
            self.notify(f"{what}: {reason or 'no reason given'}", title="refused", severity="error")

    def action_stop(self) -> None:
        if self.tuner is not None and self.tuner.state == State.RUNNING:
            self.tuner.cancel()
            self.notify("stopping: the best verified setting is put back")

    def action_close(self) -> None:
        self.dismiss()
