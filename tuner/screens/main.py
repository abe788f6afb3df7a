"""The main screen: the panels, and how each one is filled from the session's store on a tick.

The screen pulls every panel's window from the store (tuner.widgets.views) when the app says the
revision moved; it never writes the store and never talks to the server. Operator state that is not
in the store (a change in flight, the last refusal, each knob's availability, the pinned baseline)
is handed down by the app as a ControlState; the screen reads nothing else of the app but the
session, and says it is ready with a message.
"""

from __future__ import annotations

import math
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.content import Content
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static

from probes.names import STEPS
from tuner.core import ab as ab_runs
from tuner.core import setting as vocab
from tuner.core.control import ControlState
from tuner.core.event_text import short_error
from tuner.core.events import EventKind
from tuner.core.records import thaw
from tuner.messages import CaptureProgress, RelaunchProgress
from tuner.widgets import views
from tuner.widgets.ab import ABReadout, ABView, Metric
from tuner.widgets.acceptance import PositionBars
from tuner.widgets.charts import TimeChart
from tuner.widgets.event_log import EventLog
from tuner.widgets.fmt import rel_time
from tuner.widgets.footer import KeyFooter
from tuner.widgets.gpus import GpuTable
from tuner.widgets.header import HeaderView, ServerHeader, replay_detail
from tuner.widgets.knobs import KnobsPanel, KnobView
from tuner.widgets.latency import LatencyPanel
from tuner.widgets.phases import PhaseSplit
from tuner.widgets.what_if import WhatIfLine

CHART_WINDOW_S = 60.0
SHORT_BELOW = 36
"""Terminal rows under which the main screen draws its short layout (see on_resize)."""
PHASE_WINDOW_S = 10.0
TITLES = {"throughput-panel": "tok/s", "acceptance-panel": "acceptance", "gpus-panel": "GPUs",
          "phases-panel": "decode iteration", "knobs-panel": "knobs", "ab-panel": "A/B",
          "events-panel": "events", "latency-panel": "latency"}
LATENCY_WINDOW_S = 30.0
"""The latency panel's window: long enough for a p99 over a few requests at a modest --rate."""


class MainScreen(Screen[None]):
    """Every panel of the live (or replayed) session.

    Args:
        control: the operator's state as the app last handed it down (`refresh_panels`, `show_control`).
        chart_window_s: seconds the charts span.
        gpu_labels: GPU index -> its label in the GPU panel.
    """

    class Ready(Message):
        """The panels exist: the app can draw them and start its timer."""

    def __init__(self, control: ControlState, *, chart_window_s: float = CHART_WINDOW_S,
                 gpu_labels: dict[int, str] | None = None) -> None:
        super().__init__()
        self.control = control
        self.chart_window_s = chart_window_s
        self.gpu_labels = gpu_labels or {}
        self._logged = 0   # store.events_added when the log last took its events
        self._origin = math.nan
        self._latency_ab = views.LatencyABCache()

    def compose(self) -> ComposeResult:
        yield ServerHeader(id="header")
        yield Static(id="notice")        # what the server lacks and the fix; hidden when nothing is
        with Horizontal(id="body"):
            with VerticalScroll(id="left", can_focus=False):
                with Vertical(id="throughput-panel", classes="panel"):
                    yield Static(id="throughput-legend")
                    yield TimeChart(id="throughput")
                with Horizontal(id="acceptance-panel", classes="panel"):
                    yield TimeChart(id="accept-chart")
                    yield PositionBars(id="positions")
                with Vertical(id="gpus-panel", classes="panel"):
                    yield GpuTable(id="gpus")
                # The controls sit under the charts so the right column keeps the answers (where the
                # time goes, the A/B, the events) on screen down to 100x30.
                with Vertical(id="knobs-panel", classes="panel"):
                    yield KnobsPanel(id="knobs")
                # Under the controls, and only once the session has a latency event (a load request,
                # histogram buckets, or the server's lack of them): the right column keeps its answers
                # on small terminals, and a recording made before latency was recorded looks as it did.
                with Vertical(id="latency-panel", classes="panel"):
                    yield LatencyPanel(id="latency")
            with VerticalScroll(id="right", can_focus=False):
                with Vertical(id="phases-panel", classes="panel"):
                    yield PhaseSplit(id="phases")
                    yield WhatIfLine(id="what-if")
                with Vertical(id="ab-panel", classes="panel"):
                    yield ABReadout(id="ab")
                with Vertical(id="events-panel", classes="panel"):
                    yield EventLog(id="events")
        yield Static(id="capture-bar")
        yield KeyFooter()

    def on_mount(self) -> None:
        for wid, title in TITLES.items():
            self.query_one(f"#{wid}").border_title = title
        if self.control.read_only:
            self.query_one("#knobs-panel").border_title = "setting"
        # The first frame before the first layout (the app drained the bus already), then the app's timer.
        self.refresh_panels()
        self.post_message(self.Ready())

    @property
    def session(self) -> Any:
        return self.app.session

    def on_resize(self) -> None:
        # A short terminal drops the accept-length chart (the per-position bars stay) and draws the
        # phase split with each phase's collectives on its own line, so at 100x30 the phase split,
        # the A/B and the newest events stay on screen; each column still scrolls, so every panel
        # stays reachable at 80x24. A narrow one shortens the footer (tuner.widgets.footer).
        short = self.size.height < SHORT_BELOW
        self.set_class(short, "-short")
        self.query_one("#phases", PhaseSplit).compact = short
        self.query_one("#events", EventLog).one_row = short
        self.query_one("#what-if", WhatIfLine).set_compact(short)
        self.query_one(KeyFooter).fit(self.size.width)

    def show_activity(self, text: str) -> None:
        """What runs in the background (a capture, py-spy, a relaunch) in the bar above the footer; "" hides it."""
        bar = self.query_one("#capture-bar", Static)
        bar.update(text)
        bar.set_class(bool(text), "-active")

    @on(CaptureProgress)
    def _capture_progress(self, message: CaptureProgress) -> None:
        frac = "" if message.fraction is None else f" {message.fraction * 100:.0f}%"
        self.show_activity(f"⧗ trace capture{frac}: {message.text}")

    @on(RelaunchProgress)
    def _relaunch_progress(self, message: RelaunchProgress) -> None:
        if self.control.relaunching:
            self.show_activity(f"⧗ relaunch for {self.control.relaunching}: {message.text[-160:]}")

    def latest_analysis(self) -> tuple[Any, str] | None:
        """The newest capture's analysis in the store and its title; None when there is none."""
        analysed = [tr for tr in self.session.store.traces() if tr.analysis is not None]
        if not analysed:
            return None
        latest = analysed[-1]
        when = rel_time(latest.t - self.origin())
        return thaw(latest.analysis), f"trace analysis · {latest.trace_id} · captured at {when}"

    def clear_log(self) -> None:
        """Forget what the event log showed (a replay seek refills the store from the start)."""
        self._logged = 0
        self.query_one("#events", EventLog).clear()

    def origin(self) -> float:
        """Session time 0 for every relative time shown (the recording's start on replay)."""
        start = getattr(self.session.backend, "start_t", None)
        if start is not None and math.isfinite(start):
            return start
        if math.isnan(self._origin) and math.isfinite(self.session.store.t_first):
            self._origin = self.session.store.t_first
        return self._origin if math.isfinite(self._origin) else self.session.now()

    def show_control(self, control: ControlState) -> None:
        """The operator's state changed (a change sent or answered, a relaunch): redraw the knobs."""
        self.control = control
        self.query_one("#knobs", KnobsPanel).show(self.knob_view(self.session.active_config()))

    def refresh_panels(self, control: ControlState | None = None) -> None:
        """Pull every panel's window from the store and hand it to the panel (with `control`, the
        operator's state now)."""
        if control is not None:
            self.control = control
        store, origin = self.session.store, self.origin()
        now = self.session.now()
        t_end = now if math.isfinite(now) else store.t_last
        active = self.session.active_config()
        self.draw_header(active)
        self._draw_notice()
        chart = views.throughput_view(store, origin, t_end, self.chart_window_s)
        self.query_one("#throughput", TimeChart).show(chart)
        self.query_one("#throughput-legend", Static).update(self._legend(chart), layout=False)
        self.query_one("#accept-chart", TimeChart).show(
            views.accept_chart_view(store, origin, t_end, self.chart_window_s))
        steps = active.get(STEPS)
        self.query_one("#positions", PositionBars).show(
            views.accept_view(store, t_end, steps if isinstance(steps, int) else None))
        why_no_phases = self._why_no_phases()
        self.query_one("#phases", PhaseSplit).show(views.phase_view(store, t_end, PHASE_WINDOW_S, why_no_phases))
        info = self.session.server_info()
        self.query_one("#what-if", WhatIfLine).show(views.what_if_view(
            store, t_end, active, info.get("tp_size"), PHASE_WINDOW_S,
            has_phases=not why_no_phases and (not self.control.read_only or bool(store.series_names("phase/"))),
            device=(info.get("launch") or {}).get("device"), kind=info.get("kind")))
        self.query_one("#gpus", GpuTable).show(views.gpu_view(store, t_end, note=self._why_no_gpus(),
                                                                labels=self.gpu_labels))
        self.query_one("#knobs", KnobsPanel).show(self.knob_view(active))
        latency = views.latency_view(store, t_end, LATENCY_WINDOW_S)
        panel = self.query_one("#latency-panel")
        if panel.display != (latency is not None):
            panel.display = latency is not None
        if latency is not None:
            self.query_one("#latency", LatencyPanel).show(latency)
        ab = self._ab_view(t_end)
        self.query_one("#ab", ABReadout).show(ab)
        self.query_one("#ab-panel").border_subtitle = ab.baseline
        # By arrival, not by time: a config change derived from the phase stream is stamped with its
        # iteration's time, which can be older than a read-back event already in the log.
        events = store.events_since(self._logged)
        self._logged = store.events_added
        if events:
            lines = [line for e in events if (line := views.event_line(e, origin)) is not None]
            self.query_one("#events", EventLog).add(lines)

    # -- panel helpers (presentation only) --------------------------------------------------------

    def _draw_notice(self) -> None:
        backend = self.session.backend
        caps = None if backend is None or self.control.read_only else backend.capabilities
        text = "\n".join([*caps.missing, caps.still_works]) if caps is not None and caps.missing else ""
        notice = self.query_one("#notice", Static)
        if text != getattr(notice, "_shown", ""):
            notice._shown = text                      # type: ignore[attr-defined]
            notice.update(Content(text))
            notice.display = bool(text)

    def draw_header(self, active: dict | None = None) -> None:
        info = self.session.server_info()
        active = self.session.active_config() if active is None else active
        backend = self.session.backend
        notes = self._notes(info)
        if self.control.read_only:
            state = "paused" if getattr(backend, "paused", False) else "replay"
            detail = replay_detail(self.session.now() - self.origin(), backend.length_s, backend.speed)
        else:
            conn = self.session.connection()
            state = conn.state          # connecting | connected | degraded | disconnected
            detail = ""
            if state == "degraded":
                detail = short_error(conn.degraded, 60, keep_path=True)
            elif state == "disconnected":
                away = max(0.0, self.session.now() - conn.since)
                detail = f"{away:.0f} s · {short_error(conn.error, 40)}"
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
        return "   ".join(parts) + f"   [dim]{views.SMOOTH_S:g}-s means · red: setting changed[/]"

    def knob_view(self, active: dict) -> KnobView:
        c = self.control
        return KnobView(values=vocab.by_arg(active), unavailable=dict(c.unavailable), pending=c.pending,
                        refused=c.refused, load=self._load_text(), read_only=c.read_only, relaunch=c.relaunch,
                        notes=c.notes)

    def _load_text(self) -> str:
        if self.control.read_only:
            return ""
        load = self.session.load
        if load is None:
            return f"off · l starts {self.control.load_concurrency} concurrent"
        now = self.session.now()
        tok = views.mean(self.session.store.window("load/tok_per_s", now - views.SMOOTH_S, now).v)
        return f"{self.control.load_concurrency} concurrent · client {tok:.1f} tok/s" if tok == tok else \
            f"{self.control.load_concurrency} concurrent"

    def _ab_view(self, now: float) -> ABView:
        change = self.session.store.last_event(EventKind.CONFIG_CHANGED, at=now)
        if change is None:
            return ABView()
        label = views.change_label(change.data.get("old") or {}, change.data.get("new") or {})
        if not self.control.read_only and not self.session.connection().connected:
            # Readings taken while the server is away are not the new setting's: wait for it.
            return ABView(label, False, "the server is not answering")
        tok = self.session.ab(now=now)
        acc = self.session.ab("spec/accept_len", now=now)
        base_at, base_words = self.baseline(now)
        if not tok.ready:
            return ABView(label, False, tok.text().removeprefix("not yet").strip(" ()"), baseline=base_words)
        metrics = [Metric("vs previous", tok.median_before, tok.median_after, tok.ratio, tok.lo, tok.hi)]
        note = ""
        # The baseline's own row only when it is not the previous setting's run (that row says it).
        base_run = ab_runs.run_span(self.session.store, base_at, now) if base_at is not None else None
        if base_run is not None and base_run[0] >= tok.change_t:
            note = "is the setting running now"
        elif base_run is not None and base_run[1] < tok.change_t:
            base = self.session.ab(now=now, baseline_at=base_at)
            if base.ready:
                metrics.append(Metric("vs baseline", base.median_before, base.median_after, base.ratio,
                                      base.lo, base.hi, "base"))
            else:
                note = base.text()
        elif base_run is not None:
            note = "= previous"
        if acc.ready:
            metrics.append(Metric("accept len", acc.median_before, acc.median_after, acc.ratio, acc.lo, acc.hi, "τ"))
        lat = self._latency_ab.get(self.session.store, now)
        if lat is not None and lat.status == "ready":
            metrics.append(Metric("ITL p99 ms", lat.before_s * 1e3, lat.after_s * 1e3, lat.ratio, lat.lo, lat.hi,
                                  "ITL", lower_better=True))
        return ABView(label, True, "", tuple(metrics), base_words, note)

    def baseline(self, now: float) -> tuple[float | None, str]:
        """When the A/B's baseline ran (a time inside its run; None before the first change) and the
        panel's words for it."""
        pin = self.control.baseline_pin
        if pin is not None and pin[0] <= now:    # a replay seeked back before the pin: the default
            return pin[0], f"base {vocab.compact(pin[1])} (pinned {rel_time(pin[0] - self.origin())}) · b moves"
        first = next(iter(self.session.store.events(EventKind.CONFIG_CHANGED)), None)
        if first is None or first.t > now:
            return None, "b pins a baseline"
        where = "start" if self.control.read_only else "attach"
        return first.t - 1e-3, f"base {vocab.compact(first.data.get('old') or {})} ({where}) · b pins"

    def _why_no_phases(self) -> str:
        backend = self.session.backend
        if backend is None or backend.HAS_PHASE_TIMERS or backend.READ_ONLY:
            return ""
        return ("this server has no phase timers: install the specdecode plugin in the server "
                "(probes/inserver), or press c for a trace capture")

    def _why_no_gpus(self) -> str:
        backend = self.session.backend
        if backend is not None and backend.READ_ONLY:
            return "no GPU readings in this recording (recorded on CPU, or away from the GPUs)"
        if backend is not None and not backend.READ_ONLY and not backend.LOCAL_GPUS:
            return "no local GPU readings: the server's GPUs are not on this host (or it runs on CPU)"
        return "no GPU readings: the server runs on CPU, or NVML is not available here"

    def _notes(self, info: dict) -> list[str]:
        """Flags a reader must not miss, from the server's own description of itself."""
        notes = []
        launch = info.get("launch") or {}
        if info.get("emulated_comm") or launch.get("emulate_comm_latency"):
            value = launch.get("emulate_comm_latency")
            notes.append(f"emulated comm latency {value} µs" if value else "emulated comm latency")
        if info.get("simulated_accept") or launch.get("speculative_simulate_accept"):
            notes.append("simulated acceptance")
        if launch.get("load_format") == "dummy":
            notes.append("random weights")
        return notes
