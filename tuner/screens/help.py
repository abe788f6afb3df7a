"""The help screen: every key, what the panels mean, and how the numbers are computed.

Built from the app's own bindings, so the list cannot drift from what the keys do.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

PANELS = """
## Panels

- **tok/s** — decode tokens per second: the server's count (blue) and, when the load driver
  runs, the client's own count (yellow). Red lines mark where the speculative setting changed.
- **acceptance** — accept length τ over time (tokens committed per verify, bonus token included)
  and per position: p_k, the share of verifies that accepted at least k drafts, and
  α_k = p_k / p_(k-1).
- **phase split** — where one decode iteration's time goes, mean over the last seconds. Each phase
  is split into its own work (█) and the collectives inside it (▒); idle is wall minus the phases.
- **GPUs** — one row per local GPU: SM activity with recent history, memory, power, PCIe and
  NVLink traffic (↓ received, ↑ sent, bytes per second).
- **A/B** — after a change: tok/s and accept length before vs after, the ratio of medians of
  1-s windows and its 95 % interval; "not yet" until both sides have enough windows.
- **events** — changes, refusals (with the server's reason), captures, disconnects.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 95%; height: 90%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, keys: list[tuple[str, str]], read_only: bool) -> None:
        super().__init__()
        self._keys = keys
        self._read_only = read_only

    def compose(self) -> ComposeResult:
        rows = "\n".join(f"| `{k}` | {what} |" for k, what in self._keys)
        intro = ("Replaying a recording: the setting cannot be changed here."
                 if self._read_only else "Keys work anywhere on the main screen; the key hints "
                 "in the knobs panel can also be clicked.")
        text = f"# specdecode-tune\n\n{intro}\n\n| key | action |\n|---|---|\n{rows}\n{PANELS}"
        with VerticalScroll():
            yield Markdown(text)

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = "help · esc to close"
