"""The TUI: a thin Textual face over one headless Session (live server or recording).

A timer calls `session.tick()`; when the store's revision moved, each panel pulls the window it
draws (tuner.widgets.views). Operator keys become control calls in worker threads; their results
come back as events through the session, so the store, a recording and the report all see them.
This module owns no measuring and no state logic: no statistics, no HTTP, no NVML.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from tuner.core.session import Session
from tuner.messages import CaptureFinished, CaptureProgress, ControlFinished, PySpyFinished
from tuner.screens.help import HelpScreen
from tuner.widgets import views
from tuner.widgets.ab import ABReadout, ABView, Metric
from tuner.widgets.acceptance import PositionBars
from tuner.widgets.charts import TimeChart
from tuner.widgets.event_log import EventLog
from tuner.widgets.gpus import GpuTable
from tuner.widgets.header import HeaderView, ServerHeader, replay_detail
from tuner.widgets.knobs import KnobsPanel, KnobView
from tuner.widgets.phases import PhaseSplit

PLACEMENTS = ("sharded", "replicated", "rank0")
STEPS, TOPK, DRAFT, PLACEMENT = ("speculative_num_steps", "speculative_eagle_topk",
                                 "speculative_num_draft_tokens", "speculative_draft_placement")
CONTROL_ACTIONS = {"steps", "topk", "draft_tokens", "placement", "toggle_load", "capture_trace", "pyspy"}
REPLAY_ACTIONS = {"pause", "step", "seek", "speed"}
CHART_WINDOW_S = 60.0
PHASE_WINDOW_S = 10.0


class TunerApp(App[None]):
    """specdecode-tune's TUI over a Session.

    Args:
        session: the headless session (started by the caller or by the app on mount).
        tick_s: seconds between ticks; None runs no timer (tests call `tick()` themselves).
        load_concurrency: concurrency the load toggle starts with (0: the toggle starts nothing).
        prompts: prompts for the load driver.
        start_load: start the load driver as soon as the app is up.
    """

    CSS_PATH = "app.tcss"
    TITLE = "specdecode-tune"
    BINDINGS = [
        Binding("plus,equals_sign", "steps(1)", "steps+", key_display="+"),
        Binding("minus", "steps(-1)", "steps-", key_display="-"),
        Binding("t", "topk(1)", "topk+"),
        Binding("T", "topk(-1)", "topk-", show=False),
        Binding("d", "draft_tokens(1)", "draft+"),
        Binding("D", "draft_tokens(-1)", "draft-", show=False),
        Binding("p", "placement", "placement"),
        Binding("l", "toggle_load", "load"),
        Binding("c", "capture_trace", "trace"),
        Binding("y", "pyspy", "py-spy"),
        Binding("space", "pause", "pause"),
        Binding("full_stop", "step", "step", key_display="."),
        Binding("left", "seek(-10)", "-10s", key_display="←"),
        Binding("right", "seek(10)", "+10s", key_display="→"),
        Binding("less_than_sign", "speed(0.5)", "slower", key_display="<"),
        Binding("greater_than_sign", "speed(2)", "faster", key_display=">"),
        Binding("question_mark,f1", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, session: Session, *, tick_s: float | None = 0.25, load_concurrency: int = 0,
                 prompts: list[dict] | None = None, chart_window_s: float = CHART_WINDOW_S,
                 start_load: bool = False, max_new_tokens: int = 128) -> None:
        super().__init__()
        self.session = session
        self.tick_s = tick_s
        self.load_concurrency = load_concurrency
        self.prompts = prompts or []
        self.chart_window_s = chart_window_s
        self.autostart_load = start_load
        self.max_new_tokens = max_new_tokens
        self.read_only = bool(getattr(session.backend, "READ_ONLY", False))
        self.pending = ""
        self.refused = ""
        self._seen_revision = -1
        self._logged_until = -math.inf
        self._origin = math.nan

    # -- layout -----------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield ServerHeader(id="header")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with Vertical(id="throughput-panel", classes="panel"):
                    yield Static(id="throughput-legend")
                    yield TimeChart(id="throughput")
                with Horizontal(id="acceptance-panel", classes="panel"):
                    yield TimeChart(id="accept-chart")
                    yield PositionBars(id="positions")
                with Vertical(id="gpus-panel", classes="panel"):
                    yield GpuTable(id="gpus")
            with Vertical(id="right"):
                with Vertical(id="phases-panel", classes="panel"):
                    yield PhaseSplit(id="phases")
                with Vertical(id="knobs-panel", classes="panel"):
                    yield KnobsPanel(id="knobs")
                with Vertical(id="ab-panel", classes="panel"):
                    yield ABReadout(id="ab")
                with Vertical(id="events-panel", classes="panel"):
                    yield EventLog(id="events")
        yield Static(id="capture-bar")
        yield Footer()

    def on_mount(self) -> None:
        titles = {"throughput-panel": "tok/s", "acceptance-panel": "acceptance",
                  "gpus-panel": "GPUs", "phases-panel": "decode iteration",
                  "knobs-panel": "setting" if self.read_only else "knobs",
                  "ab-panel": "A/B", "events-panel": "events"}
        for wid, title in titles.items():
            self.query_one(f"#{wid}").border_title = title
        self.set_class(self.read_only, "-read-only")
        self.session.start()
        self.tick()
        if self.tick_s:
            self.set_interval(self.tick_s, self.tick)
        if self.autostart_load and not self.read_only and self.prompts:
            self._load_worker(True)

    def on_unmount(self) -> None:
        self.session.close()

    # -- the one loop: tick, then pull ------------------------------------------------------------

    def tick(self) -> None:
        """Drain the session's bus and redraw the panels if the store changed."""
        self.session.tick()
        store = self.session.store
        if store.revision != self._seen_revision:
            self._seen_revision = store.revision
            self.refresh_panels()
        elif self.read_only:
            self._draw_header()

    def origin(self) -> float:
        """Session time 0 for every relative time shown (the recording's start on replay)."""
        start = getattr(self.session.backend, "start_t", None)
        if start is not None and math.isfinite(start):
            return start
        if math.isnan(self._origin) and math.isfinite(self.session.store.t_first):
            self._origin = self.session.store.t_first
        return self._origin if math.isfinite(self._origin) else self.session.now()

    def refresh_panels(self) -> None:
        store, origin = self.session.store, self.origin()
        now = self.session.now()
        t_end = now if math.isfinite(now) else store.t_last
        active = self.session.active_config()
        self._draw_header(active)
        chart = views.throughput_view(store, origin, t_end, self.chart_window_s)
        self.query_one("#throughput", TimeChart).show(chart)
        self.query_one("#throughput-legend", Static).update(self._legend(chart))
        self.query_one("#accept-chart", TimeChart).show(
            views.accept_chart_view(store, origin, t_end, self.chart_window_s))
        steps = active.get(STEPS)
        self.query_one("#positions", PositionBars).show(
            views.accept_view(store, t_end, steps if isinstance(steps, int) else None))
        self.query_one("#phases", PhaseSplit).show(
            views.phase_view(store, t_end, PHASE_WINDOW_S, self._why_no_phases()))
        self.query_one("#gpus", GpuTable).show(views.gpu_view(store, t_end, note=self._why_no_gpus()))
        self.query_one("#knobs", KnobsPanel).show(self._knob_view(active))
        self.query_one("#ab", ABReadout).show(self._ab_view(t_end))
        events = store.events(t0=self._logged_until, t1=math.inf)
        events = [e for e in events if e.t > self._logged_until]
        if events:
            self._logged_until = events[-1].t
            lines = [line for e in events if (line := views.event_line(e, origin)) is not None]
            self.query_one("#events", EventLog).add(lines)

    # -- panel helpers (presentation only) --------------------------------------------------------

    def _draw_header(self, active: dict | None = None) -> None:
        info = self.session.server_info()
        active = self.session.active_config() if active is None else active
        backend = self.session.backend
        notes = self._notes(info)
        if self.read_only:
            state = "paused" if getattr(backend, "paused", False) else "replay"
            detail = replay_detail(self.session.now() - self.origin(), getattr(backend, "length_s", math.nan),
                                   getattr(backend, "speed", 1.0), getattr(backend, "paused", False))
        else:
            conn = self.session.connection()
            state = "connecting" if math.isnan(conn.since) else ("connected" if conn.connected else "disconnected")
            detail = conn.error if not conn.connected else ""
        launch = info.get("launch") or {}
        tp = info.get("tp_size", launch.get("tp_size"))
        self.query_one("#header", ServerHeader).show(HeaderView(
            kind=str(info.get("kind", "")), version=str(info.get("version", "")),
            model=str(info.get("model", "")), tp=tp if isinstance(tp, int) else None,
            host=str(info.get("host", "")), setting=views.setting_text(active),
            connection=state, detail=detail, notes=tuple(notes)))

    def _legend(self, chart: Any) -> str:
        parts = []
        for s in chart.series:
            last = next((v for v in reversed(s.v) if v == v), math.nan)
            r, g, b = s.color
            parts.append(f"[rgb({r},{g},{b})]━━[/] {s.label} [b]{last:.1f}[/]" if last == last
                         else f"[rgb({r},{g},{b})]━━[/] {s.label} [dim]n/a[/]")
        if not parts:
            return "[dim]waiting for readings…[/]"
        return "   ".join(parts) + "   [dim]│ red line: setting changed[/]"

    def _capability(self, key: str) -> str:
        """"" when the backend can change `key` live, else why not (and what would)."""
        backend = self.session.backend
        if backend is None:
            return "no server to change"
        return backend.why_not(key) or ""

    def _knob_view(self, active: dict) -> KnobView:
        unavailable = {k: r for k in (STEPS, TOPK, DRAFT, PLACEMENT) if (r := self._capability(k))}
        return KnobView(
            steps=active.get(STEPS), topk=active.get(TOPK), num_draft_tokens=active.get(DRAFT),
            placement=active.get(PLACEMENT), unavailable=unavailable, pending=self.pending,
            refused=self.refused, load=self._load_text(), read_only=self.read_only)

    def _load_text(self) -> str:
        if self.read_only:
            return ""
        load = self.session.load
        if load is None:
            return "off" if self.load_concurrency else "off (start with --load N)"
        tok = self.session.store.value("load/tok_per_s")
        return f"{self.load_concurrency} concurrent · {tok:.1f} tok/s" if tok == tok else \
            f"{self.load_concurrency} concurrent"

    def _ab_view(self, now: float) -> ABView:
        change = self.session.store.last_event("config_changed", at=now)
        if change is None:
            return ABView()
        label = views.change_label(change.data.get("old") or {}, change.data.get("new") or {})
        tok = self.session.ab(now=now)
        acc = self.session.ab("spec/accept_len", now=now)
        if not tok.ready:
            return ABView(label, False, tok.text().removeprefix("not yet").strip(" ()"))
        metrics = [Metric("tok/s", tok.median_before, tok.median_after, tok.ratio, tok.lo, tok.hi)]
        if acc.ready:
            metrics.append(Metric("accept len", acc.median_before, acc.median_after, acc.ratio, acc.lo, acc.hi))
        return ABView(label, True, "", tuple(metrics))

    def _why_no_phases(self) -> str:
        backend = self.session.backend
        if backend is None or backend.HAS_PHASE_TIMERS or backend.READ_ONLY:
            return ""
        return ("this server has no phase timers: install the specdecode plugin in the server "
                "(probes/inserver), or press c for a trace capture")

    def _why_no_gpus(self) -> str:
        backend = self.session.backend
        if backend is not None and not backend.READ_ONLY and not backend.LOCAL_GPUS:
            return "no local GPU readings: the server's GPUs are not on this host (or it runs on CPU)"
        return "no GPU readings: the server runs on CPU, or NVML is not available here"

    def _notes(self, info: dict) -> list[str]:
        """Flags a reader must not miss, from the server's own description of itself."""
        notes = []
        launch = info.get("launch") or {}
        emulated = launch.get("emulate_comm_latency") or info.get("emulate_comm_latency")
        if emulated:
            notes.append(f"emulated comm latency {emulated}")
        if launch.get("load_format") == "dummy":
            notes.append("random weights")
        return notes

    # -- keys -------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CONTROL_ACTIONS:
            return not self.read_only
        if action in REPLAY_ACTIONS:
            return self.read_only
        return True

    def action_steps(self, delta: int) -> None:
        self._bump(STEPS, delta, lo=0)

    def action_topk(self, delta: int) -> None:
        self._bump(TOPK, delta, lo=1)

    def action_draft_tokens(self, delta: int) -> None:
        self._bump(DRAFT, delta, lo=1)

    def action_placement(self) -> None:
        current = self.session.active_config().get(PLACEMENT)
        nxt = PLACEMENTS[(PLACEMENTS.index(current) + 1) % len(PLACEMENTS)] if current in PLACEMENTS else PLACEMENTS[0]
        self.request_change(PLACEMENT, nxt)

    def _bump(self, key: str, delta: int, lo: int) -> None:
        current = self.session.active_config().get(key)
        if not isinstance(current, int):
            self.notify(f"the server has not reported {views.knob_name(key)} yet", severity="warning")
            return
        self.request_change(key, max(lo, current + delta))

    def request_change(self, key: str, value: Any) -> None:
        """Send one change, unless the backend cannot do it (then say why)."""
        reason = self._capability(key)
        if reason:
            self.notify(reason, title=f"{views.knob_name(key)} cannot change here", severity="warning")
            return
        old = self.session.active_config().get(key)
        self.pending = f"{views.knob_name(key)} {old} → {value}"
        self.refused = ""
        self._send_change(key, value)
        self.query_one("#knobs", KnobsPanel).show(self._knob_view(self.session.active_config()))

    @work(thread=True, group="control", exit_on_error=False)
    def _send_change(self, key: str, value: Any) -> None:
        try:
            result = self.session.set_config({key: value})
            ok, reason = bool(getattr(result, "ok", result)), str(getattr(result, "reason", "") or "")
        except Exception as exc:   # a dead server must not end the app; say what happened
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        self.post_message(ControlFinished(key, value, ok, reason))

    @on(ControlFinished)
    def _control_finished(self, message: ControlFinished) -> None:
        self.pending = ""
        if not message.ok:
            self.refused = f"{views.knob_name(message.key)}={message.value}: {message.reason or 'no reason given'}"
            self.notify(self.refused, title="refused", severity="error")
        self.query_one("#knobs", KnobsPanel).show(self._knob_view(self.session.active_config()))

    def action_toggle_load(self) -> None:
        if self.session.load is not None:
            self._load_worker(False)
        elif not self.load_concurrency or not self.prompts:
            self.notify("no load configured: start with --load N", severity="warning")
        else:
            self._load_worker(True)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_worker(self, start: bool) -> None:
        try:
            if start:
                self.session.start_load(self.prompts, self.load_concurrency, self.max_new_tokens)
            else:
                self.session.stop_load()
        except Exception as exc:
            self.call_from_thread(self.notify, f"load: {exc}", severity="error")

    def action_capture_trace(self) -> None:
        backend = self.session.backend
        if not getattr(backend, "CAN_CAPTURE_TRACE", False):
            self.notify("this server cannot capture traces", severity="warning")
            return
        self._show_capture("starting a trace capture across all ranks…")
        self._capture_worker()

    @work(thread=True, exclusive=True, group="capture", exit_on_error=False)
    def _capture_worker(self) -> None:
        try:
            analysis = self.session.capture_trace(
                progress=lambda text, frac=None: self.post_message(CaptureProgress(text, frac)))
            self.post_message(CaptureFinished(analysis))
        except Exception as exc:
            self.post_message(CaptureFinished(None, f"{type(exc).__name__}: {exc}"))

    def _show_capture(self, text: str) -> None:
        bar = self.query_one("#capture-bar", Static)
        bar.update(text)
        bar.set_class(bool(text), "-active")

    @on(CaptureProgress)
    def _capture_progress(self, message: CaptureProgress) -> None:
        frac = "" if message.fraction is None else f" {message.fraction * 100:.0f}%"
        self._show_capture(f"⧗ trace capture{frac}: {message.text}")

    @on(CaptureFinished)
    def _capture_finished(self, message: CaptureFinished) -> None:
        self._show_capture("")
        if message.analysis is None:
            self.notify(message.error, title="trace capture failed", severity="error")
            return
        from tuner.screens.trace import TraceScreen
        self.push_screen(TraceScreen(message.analysis))

    def action_pyspy(self) -> None:
        self._show_capture("⧗ sampling the server's Python stacks with py-spy…")
        self._pyspy_worker()

    @work(thread=True, exclusive=True, group="pyspy", exit_on_error=False)
    def _pyspy_worker(self) -> None:
        try:
            self.post_message(PySpyFinished(self.session.pyspy()))
        except Exception as exc:
            self.post_message(PySpyFinished(None, f"{type(exc).__name__}: {exc}"))

    @on(PySpyFinished)
    def _pyspy_finished(self, message: PySpyFinished) -> None:
        self._show_capture("")
        if message.result is None:
            self.notify(message.error, title="py-spy failed", severity="error")
            return
        from tuner.screens.pyspy import PySpyScreen
        self.push_screen(PySpyScreen(message.result))

    # -- replay keys --------------------------------------------------------------------------------

    def action_pause(self) -> None:
        backend = self.session.backend
        backend.play() if backend.paused else backend.pause()
        self._draw_header()

    def action_step(self, dt: float = 1.0) -> None:
        """One step of `dt` recording seconds (pauses first: stepping a running replay means nothing)."""
        backend = self.session.backend
        if not backend.paused:
            backend.pause()
        backend.step(dt)
        self.tick()
        self._draw_header()

    def action_seek(self, delta: float) -> None:
        backend = self.session.backend
        target = min(max(self.session.now() + delta, backend.start_t), backend.start_t + backend.length_s)
        self.session.seek(target)
        self._logged_until = -math.inf
        self.query_one("#events", EventLog).clear()
        self.tick()

    def action_speed(self, factor: float) -> None:
        backend = self.session.backend
        speed = max(0.25, min(64.0, backend.speed * factor))
        setter = getattr(backend, "set_speed", None)
        if setter is not None:
            setter(speed)
        else:
            backend.speed = speed
        self._draw_header()

    # -- help and palette -------------------------------------------------------------------------

    def key_help(self) -> list[tuple[str, str]]:
        keys = []
        for b in self.BINDINGS:
            assert isinstance(b, Binding)
            name = b.action.split("(")[0]
            if self.check_action(name, ()) is False:
                continue
            keys.append((b.key_display or b.key.split(",")[0], b.description))
        return keys

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.key_help(), self.read_only))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if not self.read_only:
            yield SystemCommand("More draft steps", "speculative_num_steps + 1", lambda: self.action_steps(1))
            yield SystemCommand("Fewer draft steps", "speculative_num_steps - 1", lambda: self.action_steps(-1))
            yield SystemCommand("Next draft placement", "sharded → replicated → rank0", self.action_placement)
            yield SystemCommand("Toggle the load driver", "start or stop the client load", self.action_toggle_load)
            yield SystemCommand("Capture a trace", "torch profiler on every rank, then the analysis",
                                self.action_capture_trace)
            yield SystemCommand("Sample Python stacks (py-spy)", "top functions of the server's processes",
                                self.action_pyspy)
        else:
            yield SystemCommand("Pause / resume replay", "space", self.action_pause)
        yield SystemCommand("Keys and panels", "the help screen", self.action_help)


def make_app(session: Session, *, load: int = 0, prompts: list[dict] | None = None,
             max_new_tokens: int = 128, tick_s: float | None = 0.25, start_load: bool = True) -> TunerApp:
    """The app as every command and test builds it (Posting's make_posting)."""
    return TunerApp(session, tick_s=tick_s, load_concurrency=load, prompts=prompts,
                    max_new_tokens=max_new_tokens, start_load=start_load and load > 0)
