"""The help screen: every key, what the panels mean, and how the numbers are computed.

Built from the app's own bindings, so the list cannot drift from what the keys do.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from typing import Iterable

from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Markdown, Static

from tuner.core import setting as vocab
from tuner.screens.modal import ModalPanel

# action name -> what the key does, in words (the footer's labels are too short to explain); a knob's
# keys are named by the knob and explained by its row of the knob table (action_help).
ACTION_HELP = {
    "toggle_load": "start or stop the client load (--load N requests in flight, 4 by default)",
    "capture_trace": "capture a profiler trace on every rank, then show where the time went",
    "pyspy": "sample the server's Python stacks with py-spy: its top functions",
    "analysis": "show the newest capture's analysis again",
    "tune": "tune: probe a few settings, predict tok/s for every one (± uncertainty), verify the best "
            "with an A/B; enter applies a row. On a replay: the recorded tuning",
    "pin_baseline": "pin the setting running now as the A/B's baseline (by default the setting at attach)",
    "pause": "pause / resume the replay",
    "step": "step the replay one second (pauses it)",
    "seek": "seek the replay 10 seconds back / forward",
    "speed": "halve / double the replay speed",
    "help": "this screen",
    "quit": "quit (a demo's engine is stopped too)",
    "command_palette": "command palette: every action by name",
}

PANELS = """
## Panels

- **tok/s**: decode tokens per second, 2-s means: the server's count (blue) and, when the load
  driver runs, the client's own count (yellow). Red lines mark where the setting changed.
- **acceptance**: accept length τ over time (tokens committed per verify, bonus included) and,
  per draft position k, p_k: the share of verifies that accepted at least k drafts;
  α_k = p_k / p_(k-1).
- **decode iteration**: where one iteration's time goes, mean over the last 10 s. Each phase is
  split into its own work (█) and the collectives inside it (▒); idle is wall minus the phases.
- **GPUs**: one row per local GPU: SM activity and its recent history, memory, power, PCIe and
  NVLink traffic (↓ received, ↑ sent, bytes per second).
- **draft off the TP group** (under the decode iteration): predicted tok/s if the draft ran
  replicated or on rank 0, from the measured collective share of the draft (the cost model's
  what-if: collectives removed; compute as is (high) or ×TP (low)); n/a with the reason otherwise.
- **A/B**: after a change, tok/s vs the previous setting and vs the baseline (the setting at
  attach until b pins another; its subtitle names it), and accept length vs the previous setting:
  the ratio of the medians of 1-s windows with its 95 % interval; "not yet" until both sides have
  5 windows.
- **events**: changes, refusals with the server's reason, captures, disconnects.
"""


def action_help() -> dict[str, str]:
    """What each action's keys do: the knob table's sentences, then the other actions'."""
    return {**{k.name: k.help for k in vocab.knobs()}, **ACTION_HELP}


def keys_table(keys: list[tuple[str, str, str]]) -> Table:
    """(key, action name, footer label) rows as a two-column table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold #e0b040", no_wrap=True)
    table.add_column()
    helps = action_help()
    seen: set[str] = set()
    for key, action, label in keys:
        text = helps.get(action, label)
        if action in seen and text == helps.get(action):
            # `+` and `-` share one sentence; show the pair on one line.
            continue
        pair = [k for k, a, _ in keys if a == action] if action in helps else [key]
        seen.add(action)
        table.add_row(" ".join(pair), Text(text))
    return table


class HelpScreen(ModalPanel):
    BINDINGS = [Binding("question_mark,f1", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen > .box { width: 96; max-width: 95%; }
    HelpScreen #help-intro { margin: 1 0; }
    """
    BOX_TITLE = "specdecode-tune help · esc to close"
    BOX_SUBTITLE = ""

    def __init__(self, keys: list[tuple[str, str, str]], read_only: bool) -> None:
        super().__init__()
        self._keys = keys
        self._read_only = read_only

    def body(self) -> Iterable[Widget]:
        intro = ("Replaying a recording: the setting cannot be changed here." if self._read_only else
                 "Keys work anywhere on the main screen; the key hints in the knobs panel can be clicked.")
        yield Static(intro, id="help-intro")
        yield Static(keys_table(self._keys), id="help-keys")
        yield Markdown(PANELS)
