"""The TUI: a thin Textual face over one headless Session (live server or recording).

A timer calls the headless driver's `tick()` (tuner.core.driver: it steps the tuner, runs captures
and moves the bus into the store); when the store's revision moved, each panel pulls the window it
draws (tuner.widgets.views). Operator keys become control calls in worker threads; their results
come back as events through the session, so the store, a recording and the report all see them.
Under `launch` (managed mode) a knob the server cannot change live is offered as a relaunch
(tuner.core.relaunch): a confirmation, progress in the bar, the outcome in the log.
This module owns no measuring and no state logic: no statistics, no HTTP, no NVML. It never
imports tuner.commands (the commands build the app, not the other way round).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.screen import Screen

from tuner import actions
from tuner.core import control
from tuner.core import setting as vocab
from tuner.core.control import ControlState
from tuner.core.driver import Driver
from tuner.core.relaunch import Relauncher, relaunch_changes, relaunch_keeping_load
from tuner.core.session import Session
from tuner.messages import (CaptureFinished, CaptureProgress, ControlFinished, PySpyFinished, RelaunchFinished,
                            RelaunchProgress)
from tuner.screens.help import HelpScreen
from tuner.screens.main import CHART_WINDOW_S, MainScreen
from tuner.screens.trace import TraceScreen
from tuner.screens.tune import TuneScreen
from tuner.tuning.slo import Objective
from tuner.tuning.tune_request import TuneRequest
from tuner.widgets.fmt import rel_time
from tuner.widgets.knobs import KnobsPanel
from tuner.widgets.tune_view import TUNING_KINDS, recorded_doc

DEFAULT_LOAD = 4


class TunerApp(App[None]):
    """specdecode-tune's TUI over a Session.

    Args:
        session: the headless session (started by the caller or by the app on mount).
        tick_s: seconds between ticks; None runs no timer (tests call `tick()` themselves).
        load_concurrency: requests the load driver keeps in flight (0: DEFAULT_LOAD when l is pressed).
        prompts: prompts for the load driver.
        start_load: start the load driver as soon as the app is up.
        relauncher: managed mode's relauncher (`launch`); None elsewhere: knobs the server cannot
            change live say why, and nothing offers a relaunch.
    """

    CSS_PATH = "app.tcss"
    TITLE = "specdecode-tune"
    BINDINGS = actions.bindings()

    def __init__(self, session: Session, *, tick_s: float | None = 0.25, load_concurrency: int = 0,
                 prompts: list[dict] | None = None, chart_window_s: float = CHART_WINDOW_S,
                 start_load: bool = False, max_new_tokens: int = 128,
                 gpu_labels: dict[int, str] | None = None, tune_budget_s: float = TuneRequest.budget_s,
                 tune_max_steps: int = TuneRequest.max_steps, tune_topks: tuple[int, ...] = (1,),
                 tune_draft_tokens: tuple[int, ...] = (), tune_objective: Objective | None = None,
                 relauncher: Relauncher | None = None) -> None:
        super().__init__()
        self.session = session
        self.relauncher = relauncher
        self.tick_s = tick_s
        self.prompts = prompts or []
        self.autostart_load, self.max_new_tokens = start_load, max_new_tokens
        self._main_options = {"chart_window_s": chart_window_s, "gpu_labels": gpu_labels}
        self.read_only = session.backend is not None and session.backend.READ_ONLY
        # The operator's state the screens are handed (the l key starts this many when --load gave none).
        self.control = ControlState(read_only=self.read_only, managed=relauncher is not None,
                                    load_concurrency=load_concurrency or DEFAULT_LOAD)
        self._seen_revision = -1
        # The tick, the tuner's lifecycle and captures: the same driver `record` and `tune` run.
        # A live server's own adaptive controller is checked against the per-bucket fit (a replay
        # shows the checks it recorded).
        from tuner.tuning.controller_watch import ControllerWatch
        self.driver = Driver(session, watch=None if self.read_only else ControllerWatch(session))
        # Budget and space for the next tuner:
        self.tune = TuneRequest(tune_budget_s, tune_max_steps, tuple(tune_topks), tuple(tune_draft_tokens),
                                objective=tune_objective or Objective())

    def get_default_screen(self) -> Screen:
        self.main = MainScreen(self.control_state(), **self._main_options)
        return self.main

    def on_mount(self) -> None:
        self.set_class(self.read_only, "-read-only")
        self.session.start()
        self.driver.tick()     # the main screen, mounted next, draws its first frame from the store

    @on(MainScreen.Ready)
    def _main_ready(self) -> None:
        """The main screen drew its panels: the first tick, then the timer."""
        self.tick()
        if self.tick_s:
            self.set_interval(self.tick_s, self.tick)
        if self.autostart_load and not self.read_only and self.prompts:
            self._load_worker(True)

    def on_unmount(self) -> None:
        self.driver.close_watch()
        self.driver.end_tuner()
        self.session.close()

    # -- the one loop: tick, then pull ------------------------------------------------------------

    def tick(self) -> None:
        """Drain the session's bus and redraw the panels if the store changed."""
        if not self.is_running:   # shutting down: a last timer tick may find the panels gone
            return
        self.driver.tick()
        store = self.session.store
        if store.revision != self._seen_revision:
            self._seen_revision = store.revision
            self.main.refresh_panels(self.control_state())
        elif self.read_only:
            self.main.draw_header()
        if self.tuning_on_screen() and self.screen.tuner is not None:
            self.screen.refresh_view()

    def control_state(self) -> ControlState:
        """The operator's state with every knob's availability now: what the screens are handed."""
        return self.control.at(self.session.backend, self.session.active_config())

    def _set_control(self, **changes: Any) -> None:
        self.control = replace(self.control, **changes)
        self.main.show_control(self.control_state())

    # -- keys -------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # While the tune screen is up the tuner owns the setting: no knob keys behind its back.
        return actions.allowed(action, read_only=self.read_only, tuning_on_screen=self.tuning_on_screen(),
                               relaunching=bool(self.control.relaunching))

    def tuning_on_screen(self) -> bool:
        return bool(self.screen_stack) and isinstance(self.screen_stack[-1], TuneScreen)

    def action_knob(self, name: str, delta: int = 1) -> None:
        """One key press on a knob of the table: a step within its bounds, or its next value; sent, or
        offered as a relaunch, or why not (tuner.core.control)."""
        move = control.knob_move(self.control, self.session.backend, self.session.active_config(), name, delta)
        if move is None:
            return
        if move.warning:
            self.notify(move.warning, title=move.title, severity="warning")
        elif move.relaunch:
            self.offer_relaunch(move.key, move.value)
        else:
            old = self.session.active_config().get(move.key)
            self._set_control(pending=f"{vocab.word(move.key)} {old} → {move.value}", refused="")
            self._send_change(move.key, move.value)

    @work(thread=True, group="control", exit_on_error=False)
    def _send_change(self, key: str, value: Any) -> None:
        self.post_message(ControlFinished(key, value, *control.send(self.session, key, value)))

    @on(ControlFinished)
    def _control_finished(self, message: ControlFinished) -> None:
        refused = self.control.refused
        if not message.ok:
            refused = f"{vocab.word(message.key)}={message.value}: {message.reason or 'no reason given'}"
            self.notify(refused, title="refused", severity="error")
        self._set_control(pending="", refused=refused)

    # -- managed relaunch -------------------------------------------------------------------------

    def offer_relaunch(self, key: str, value: Any) -> None:
        """Ask whether to relaunch the server with `key` = `value` (and what the launch needs with
        it); a setting the launch would refuse is said in one line and nothing is asked."""
        assert self.relauncher is not None
        changes = relaunch_changes(key, value, self.session.active_config())
        words = ", ".join(f"{vocab.word(k)} {v}" for k, v in changes.items())
        try:
            proposal = self.relauncher.proposal(changes)
        except ValueError as e:
            self.notify(str(e), title=f"cannot relaunch with {words}", severity="warning")
            return
        if proposal is None:
            self.notify(f"the server already runs {words}")
            return
        from tuner.screens.relaunch import RelaunchConfirm
        self.push_screen(RelaunchConfirm(*proposal),
                         callback=lambda yes: self._relaunch_answered(changes, words, bool(yes)))

    def _relaunch_answered(self, changes: dict[str, Any], words: str, yes: bool) -> None:
        if not yes:
            self.notify(f"not relaunched: the server keeps running as it is ({words} not applied)")
            return
        self._set_control(relaunching=words)
        self.refresh_bindings()
        self.main.show_activity(f"⧗ relaunch for {words}: stopping the server…")
        self._relaunch_worker(changes)

    @work(thread=True, exclusive=True, group="relaunch", exit_on_error=False)
    def _relaunch_worker(self, changes: dict[str, Any]) -> None:
        assert self.relauncher is not None
        error = relaunch_keeping_load(self.relauncher, self.session, changes,
                                      lambda text: self.main.post_message(RelaunchProgress(text)),
                                      lambda: self.is_running and self._start_load())   # not after a quit
        self.post_message(RelaunchFinished(changes, not error, error))

    @on(RelaunchFinished)
    def _relaunch_finished(self, message: RelaunchFinished) -> None:
        words = self.control.relaunching
        self.main.show_activity("")
        self._set_control(relaunching="")
        self.refresh_bindings()
        if message.ok:
            self.notify(f"relaunched with {words}")
        else:
            self.notify(message.error, title="relaunch failed", severity="error")

    def action_toggle_load(self) -> None:
        if self.session.load is None and not self.prompts:
            self.notify("no prompts for the load driver", severity="warning")
        else:
            self._load_worker(self.session.load is None)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_worker(self, start: bool) -> None:
        try:
            self._start_load() if start else self.session.stop_load()
        except Exception as exc:
            self.call_from_thread(self.notify, f"load: {exc}", severity="error")

    def _start_load(self) -> None:
        self.session.start_load(self.prompts, self.control.load_concurrency, self.max_new_tokens)

    def action_capture_trace(self) -> None:
        backend = self.session.backend
        if backend is None or not backend.CAN_CAPTURE_TRACE:
            self.notify("this server cannot capture traces", severity="warning")
            return
        if self.driver.busy_capturing:
            self.notify("a trace capture is already running", severity="warning")
            return
        self.main.show_activity("starting a trace capture across all ranks…")
        # Both run on the driver's capture thread: post_message is the thread-safe way back.
        self.driver.capture(progress=lambda text, fraction=None: self.main.post_message(CaptureProgress(text, fraction)),
                            done=lambda captured, error: self.post_message(CaptureFinished.of(captured, error)))

    @on(CaptureFinished)
    def _capture_finished(self, message: CaptureFinished) -> None:
        self.main.show_activity("")
        if message.folder:
            self.notify(f"{message.folder} (open them in ui.perfetto.dev)", title="trace files kept in", timeout=20)
        if message.analysis is None:
            self.notify(message.error, title="trace capture failed", severity="error")
            return
        self._show_trace(message.analysis)

    def _show_trace(self, analysis: Any, title: str = "trace analysis") -> None:
        # The screen offers the PCIe-IPC relaunch when one can run here; its answer comes back as its result.
        self.push_screen(TraceScreen(analysis, title, relaunch=self.control.managed and not self.read_only),
                         callback=lambda offer: offer and self.offer_relaunch(*offer))

    def action_analysis(self) -> None:
        """Open the newest capture's analysis again (on a replay, the recorded one)."""
        latest = self.main.latest_analysis()
        if latest is None:
            self.notify("no analysed trace yet" + ("" if self.read_only else ": press c to capture one"),
                        severity="warning")
            return
        self._show_trace(*latest)

    def action_pyspy(self) -> None:
        self.main.show_activity("⧗ sampling the server's Python stacks with py-spy…")
        self._pyspy_worker()

    @work(thread=True, exclusive=True, group="pyspy", exit_on_error=False)
    def _pyspy_worker(self) -> None:
        try:
            from tuner.core.pyspy import pyspy_top
            self.post_message(PySpyFinished(pyspy_top(self.session)))
        except Exception as exc:
            self.post_message(PySpyFinished(None, f"{type(exc).__name__}: {exc}"))

    @on(PySpyFinished)
    def _pyspy_finished(self, message: PySpyFinished) -> None:
        self.main.show_activity("")
        if message.result is None:
            self.notify(message.error, title="py-spy failed", severity="error")
            return
        from tuner.screens.pyspy import PySpyScreen
        self.push_screen(PySpyScreen(message.result))

    # -- the tune screen ------------------------------------------------------------------------

    def action_tune(self) -> None:
        if self.read_only:
            recorded = recorded_doc(self.session.store.events(TUNING_KINDS))
            if recorded is None:
                self.notify("no tuning in this recording (so far)", severity="warning")
                return
            self.push_screen(TuneScreen(recorded=recorded))
            return
        if self.driver.tuner is not None:
            if self.driver.tuner_released:
                self.notify("the last tuning is still putting the server back: a moment", severity="warning")
            else:
                self._show_tuner(self.driver.tuner)
            return
        tuner, reason = self.tune.tuner(self.session)
        if tuner is None:
            self.notify(reason, title="tuning is not available here", severity="warning")
            return
        self.driver.start_tuner(tuner)
        if self.session.load is None and self.prompts:
            # The tuner measures decode iterations: without traffic there are none.
            self._load_worker(True)
            self.notify(f"started the load ({self.control.load_concurrency} concurrent): tuning needs traffic")
        self._show_tuner(tuner)

    def _show_tuner(self, tuner: Any) -> None:
        # Closing the screen hands the tuner back: it is cancelled and puts the best verified setting back.
        self.push_screen(TuneScreen(tuner), callback=lambda _: self.release_tuner())

    def release_tuner(self) -> None:
        """The tune screen closed: the tuner is cancelled, puts the best verified setting back, closes."""
        if self.driver.release_tuner():
            self.notify("tuning stopped: putting the best verified setting back")

    # -- the A/B's baseline ------------------------------------------------------------------------

    def action_pin_baseline(self) -> None:
        """Pin the setting running now as the A/B's baseline (b again moves the pin)."""
        now = self.session.now()
        active = self.session.active_config()
        if not active:
            self.notify("the server has not reported its setting yet", severity="warning")
            return
        self.control = replace(self.control, baseline_pin=(now, active))
        self.notify(f"A/B baseline: {vocab.compact(active)} (pinned at {rel_time(now - self.main.origin())})")
        self.main.refresh_panels(self.control_state())

    # -- replay keys --------------------------------------------------------------------------------

    def action_pause(self) -> None:
        backend = self.session.backend
        backend.play() if backend.paused else backend.pause()
        self.main.draw_header()

    def action_step(self, dt: float = 1.0) -> None:
        """One step of `dt` recording seconds (pauses first: stepping a running replay means nothing)."""
        self.session.backend.pause()
        self.session.backend.step(dt)
        self.tick()
        self.main.draw_header()

    def action_seek(self, delta: float) -> None:
        self.session.seek(self.session.now() + delta)      # the recording's bounds hold it
        self.driver.skip_events()
        self.main.clear_log()
        self.tick()

    def action_speed(self, factor: float) -> None:
        backend = self.session.backend
        backend.set_speed(max(0.25, min(64.0, backend.speed * factor)))
        self.main.draw_header()

    # -- help and palette -------------------------------------------------------------------------

    def key_help(self) -> list[tuple[str, str, str]]:
        """(key, action name, footer label) for every key that works in this mode."""
        return actions.key_help(read_only=self.read_only, tuning_on_screen=self.tuning_on_screen(),
                                relaunching=bool(self.control.relaunching))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.key_help(), self.read_only))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        recorded = self.read_only and bool(self.session.store.events(TUNING_KINDS))
        for a in actions.palette(read_only=self.read_only, recorded_tuning=recorded):
            yield SystemCommand(a.title, self.read_only and a.replay_hint or a.hint, partial(self.run_action, a.action))

    @on(KnobsPanel.Pressed)
    async def _knobs_pressed(self, message: KnobsPanel.Pressed) -> None:
        """A key hint clicked in the knobs panel: the same action as its key."""
        await self.run_action(message.action)


def make_app(session: Session, *, load: int = 0, prompts: list[dict] | None = None, start_load: bool = True,
             **options: Any) -> TunerApp:
    """The app as every command and test builds it (Posting's make_posting); `options` are TunerApp's."""
    if prompts is None:
        from tuner.backends.load import builtin_prompts
        prompts = builtin_prompts()
    return TunerApp(session, load_concurrency=load, prompts=prompts, start_load=start_load and load > 0, **options)
