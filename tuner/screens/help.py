"""The help screen: every key, what the panels mean, and how the numbers are computed.

Built from the action table (tuner.actions) the app's bindings come from, so the list cannot drift
from what the keys do. It shows the keys it is given and never runs an action.
"""

from __future__ import annotations

from typing import Iterable

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Markdown, Static

from tuner.actions import action_help
from tuner.screens.modal import ModalPanel

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
- **latency** (under the knobs, once there are latency readings): p50/p90/p99 of TTFT, ITL, e2e and
  queue over the last 30 s, the load driver's exact figures beside the server histogram's p99
  bucket ("≤ 40 ms"); TTFT and queue time only mean something under an open-loop `--rate` load.
  The A/B adds a p99 ITL row (lower is better) once both sides have 5 requests.
"""


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
