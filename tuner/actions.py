"""The TUI's one table of actions: keys, footer label, help sentence, palette entry and the mode each
works in (Harlequin's actions.py). The app's bindings, its command palette, the help screen's list
and `check_action` are all built here, so they cannot drift apart; the knob rows are generated from
the knob table (tuner.core.setting.KNOBS). Must not run an action, read the session or hold state:
it says what exists and when it is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from textual.actions import parse
from textual.binding import Binding

from tuner.core import setting as vocab
from tuner.widgets.knobs import knob_action


class Mode(Enum):
    """When an action works (`allowed`), in the palette's order."""

    CONTROL = "control"   # a live server; held while the tune screen owns the setting or a relaunch runs
    REPLAY = "replay"     # a recording only
    TUNE = "tune"         # held while a relaunch runs; on a replay, the recorded tuning
    ANY = "any"


@dataclass(frozen=True)
class Action:
    action: str
    """The app action with its arguments, e.g. "seek(10)"."""
    keys: str
    label: str
    """The footer's word."""
    help: str = ""
    """The help screen's sentence (rows of one action share it)."""
    title: str = ""
    """The palette's title ("": not in the palette)."""
    hint: str = ""
    """The palette's line under the title."""
    mode: Mode = Mode.ANY
    show: bool = True
    key_display: str | None = None
    priority: bool = False
    group: Binding.Group | None = None
    replay_hint: str = ""
    """The palette's line on a replay, when it differs."""

    @property
    def name(self) -> str:
        return parse(self.action)[1]

    @property
    def id(self) -> str:
        """The help's name: a knob move is its knob's name (e.g. "steps"), else the action's name."""
        _, name, params = parse(self.action)
        return str(params[0]) if name == "knob" and params else name

    def binding(self) -> Binding:
        return Binding(self.keys, self.action, self.label, show=self.show, key_display=self.key_display,
                       priority=self.priority, group=self.group)


def knob_rows() -> list[Action]:
    """One row per knob move, from the knob table (a stepped knob's "less" key is footer-hidden unless
    the row says otherwise)."""
    out = []
    for k in vocab.knobs():
        # A knob with both keys in the footer shows them as one hint ("+ - steps"): a narrow footer.
        group = Binding.Group(k.word) if k.footer_less and len(k.moves()) > 1 else None
        for i, (key, shown, delta, label) in enumerate(k.moves()):
            hint = " → ".join(k.values) if k.cycled else f"{k.arg} {'+' if delta > 0 else '-'} {k.step:g}"
            out.append(Action(knob_action(k, delta), key, label, k.help, k.palette[i] if i < len(k.palette) else "",
                              hint, Mode.CONTROL, show=k.footer and (i == 0 or k.footer_less), key_display=shown,
                              group=group))
    return out


OTHER_ROWS = [
    Action("toggle_load", "l", "load", "start or stop the client load (--load N requests in flight, 4 by default)",
           "Toggle the load driver", "start or stop the client load", Mode.CONTROL),
    Action("capture_trace", "c", "trace", "capture a profiler trace on every rank, then show where the time went",
           "Capture a trace", "torch profiler on every rank, then the analysis", Mode.CONTROL),
    Action("pyspy", "y", "py-spy", "sample the server's Python stacks with py-spy: its top functions",
           "Sample Python stacks (py-spy)", "top functions of the server's processes", Mode.CONTROL),
    Action("analysis", "a", "analysis", "show the newest capture's analysis again",
           "Trace analysis", "the newest capture's analysis"),
    Action("tune", "u", "tune", "tune: probe a few settings, predict tok/s for every one (± uncertainty), verify the "
           "best with an A/B; enter applies a row. On a replay: the recorded tuning",
           "Tune", "probe settings, predict tok/s for each, verify the best (u)", Mode.TUNE,
           replay_hint="the recorded tuning (u)"),
    # Not in the footer (the A/B panel's subtitle names it): the footer's room is for the demo's keys.
    Action("pin_baseline", "b", "baseline",
           "pin the setting running now as the A/B's baseline (by default the setting at attach)", show=False),
    Action("pause", "space", "pause", "pause / resume the replay", "Pause / resume the replay", "space", Mode.REPLAY),
    Action("step", "full_stop", "step", "step the replay one second (pauses it)", "Step the replay one second", ".",
           Mode.REPLAY, key_display="."),
    Action("seek(-10)", "left", "-10s", "seek the replay 10 seconds back / forward", "Seek 10 s back", "←",
           Mode.REPLAY, key_display="←", priority=True),
    Action("seek(10)", "right", "+10s", "seek the replay 10 seconds back / forward", "Seek 10 s forward", "→",
           Mode.REPLAY, key_display="→", priority=True),
    Action("speed(0.5)", "less_than_sign", "slower", "halve / double the replay speed", "Replay slower", "<",
           Mode.REPLAY, key_display="<"),
    Action("speed(2)", "greater_than_sign", "faster", "halve / double the replay speed", "Replay faster", ">",
           Mode.REPLAY, key_display=">"),
    Action("help", "question_mark,f1", "help", "this screen", "Keys and panels", "the help screen", key_display="?"),
    Action("quit", "q", "quit", "quit (a demo's engine is stopped too)"),
]
"""The keys that are not knobs: load, captures, the tune screen, the baseline, replay, help, quit."""

PALETTE_KEY = ("ctrl+p", "command_palette", "palette")
PALETTE_HELP = "command palette: every action by name"


def actions() -> list[Action]:
    """Every row: the knob table's, then the rest (the footer's order)."""
    return [*knob_rows(), *OTHER_ROWS]


def bindings() -> list[Binding]:
    return [a.binding() for a in actions()]


MODES = {a.name: a.mode for a in actions()}


def allowed(name: str, *, read_only: bool, tuning_on_screen: bool, relaunching: bool) -> bool:
    """Whether the action `name` works now (the app's check_action; names not in the table always do)."""
    mode = MODES.get(name, Mode.ANY)
    if relaunching and mode in (Mode.CONTROL, Mode.TUNE):
        return False       # held while a relaunch stops and starts the server: they would talk to no server
    if mode is Mode.CONTROL:
        return not read_only and not tuning_on_screen
    if mode is Mode.REPLAY:
        return read_only
    return True


def key_help(**state: bool) -> list[tuple[str, str, str]]:
    """(key, action id, footer label) for every key that works in this state, then the palette's."""
    return [(a.key_display or a.keys.split(",")[0], a.id, a.label) for a in actions()
            if allowed(a.name, **state)] + [PALETTE_KEY]


def action_help() -> dict[str, str]:
    """Action id -> what its keys do, for the help screen."""
    return {**{a.id: a.help for a in actions()}, PALETTE_KEY[1]: PALETTE_HELP}


def palette(*, read_only: bool, recorded_tuning: bool) -> list[Action]:
    """The rows the command palette offers, grouped by mode (controls, replay, tune, the rest); on a
    replay the tune row only when the recording holds a tuning."""
    rows = [a for a in actions() if a.title and allowed(a.name, read_only=read_only, tuning_on_screen=False,
                                                           relaunching=False)
            and not (a.mode is Mode.TUNE and read_only and not recorded_tuning)]
    order = list(Mode)
    return sorted(rows, key=lambda a: order.index(a.mode))
