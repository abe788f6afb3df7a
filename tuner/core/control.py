"""What the operator's controls can do now, as one value a face hands down to its views.

`ControlState` is the operator's side of a session that the store does not hold: a change sent and
not yet confirmed, the last refusal, a relaunch under way, the A/B's pinned baseline, and per knob
whether it changes live, only by a relaunch (managed mode), or why not. The TUI keeps one, replaces
it when something happens, and passes it down; its screens only read it. Plain data and plain
functions over a backend's capabilities: no I/O, no Textual, no widgets, no store.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from tuner.core import setting as vocab


@dataclass(frozen=True)
class ControlState:
    read_only: bool = False
    """A recording: the setting is shown, nothing can change."""
    managed: bool = False
    """A relauncher owns the server (`launch`): a knob the server cannot change live is offered as a relaunch."""
    load_concurrency: int = 0
    """Requests the load driver keeps in flight when l starts it."""
    pending: str = ""
    """A change sent and not yet answered, e.g. "steps 3 → 4"."""
    refused: str = ""
    """The last refusal with the server's reason, shown until the next change."""
    relaunching: str = ""
    """The changes a running relaunch applies, in words ("" when none runs)."""
    baseline_pin: tuple[float, Mapping[str, Any]] | None = None
    """(session time, setting) pinned as the A/B's baseline; None: the setting at attach."""
    unavailable: Mapping[str, str] = field(default_factory=dict)
    """knob server-arg -> why it cannot change here (knobs offered as a relaunch are not in it)."""
    relaunch: frozenset[str] = frozenset()
    """Knobs whose keys offer a relaunch."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """knob server-arg -> what limits its live values, e.g. "tiers 1 3 5 7"."""

    def at(self, backend: Any, active: Mapping[str, Any]) -> "ControlState":
        """This state with every knob's availability on `backend` (None: no server) while `active` runs."""
        relaunch = frozenset(k.arg for k in vocab.knobs() if offers_relaunch(backend, k.arg, self.managed, self.read_only))
        unavailable = {k.arg: r for k in vocab.knobs() if k.arg not in relaunch and (r := why_not(backend, k.arg))}
        return replace(self, unavailable=unavailable, relaunch=relaunch,
                       notes={} if self.read_only else knob_notes(backend, active))


def why_not(backend: Any, key: str) -> str:
    """"" when `backend` can change `key` live, else why not (and what would)."""
    if backend is None:
        return "no server to change"
    return backend.why_not(key) or ""


def offers_relaunch(backend: Any, key: str, managed: bool, read_only: bool = False) -> bool:
    """Managed mode, and `key` changes only by a relaunch of the server."""
    if not managed or backend is None or read_only:
        return False
    return backend.capabilities.needs_restart_for(key) is not None


def allowed_values(backend: Any, key: str) -> tuple | None:
    """The only values `key` takes live when the server restricts them (None: its bounds)."""
    return None if backend is None else backend.capabilities.allowed_values(key)


def knob_notes(backend: Any, active: Mapping[str, Any]) -> dict[str, str]:
    """Knob -> what limits its live values (SGLang: the tiers the plugin can pin, and where the
    active one holds when only at some batch sizes)."""
    if backend is None:
        return {}
    caps = backend.capabilities
    out: dict[str, str] = {}
    for key, allowed in caps.live_values.items():
        if not caps.can_set(key):
            continue
        text = f"tiers {' '.join(map(str, allowed))}"
        cur = active.get(key)
        note = caps.value_notes.get(key, {}).get(cur)
        if note:
            text += f" · {vocab.word(key)} {cur} {note}"
        out[key] = text
    return out


@dataclass(frozen=True)
class Move:
    """What one knob key press comes to: send `key` = `value`, offer a relaunch for it (`relaunch`),
    or only say `warning` (with `title`)."""

    key: str = ""
    value: Any = None
    relaunch: bool = False
    warning: str = ""
    title: str = ""


def knob_move(state: ControlState, backend: Any, active: Mapping[str, Any], name: str, delta: int) -> Move | None:
    """A press on knob `name` (a step of `delta` within its bounds, or its next value); None for a
    name the knob table does not have."""
    k = vocab.knob(name)
    if k is None:
        return None
    current = active.get(k.arg)
    allowed = allowed_values(backend, k.arg)
    nxt = k.bumped(current, delta, allowed)
    if nxt is None:
        return Move(warning=f"the server has not reported {k.word} yet")
    if allowed is not None and nxt == current:
        edge = "deepest" if delta > 0 else "shallowest"
        return Move(warning=f"{k.word} {current} is the {edge} this server can set live ({', '.join(map(str, allowed))})")
    return change(state, backend, k.arg, nxt)


def change(state: ControlState, backend: Any, key: str, value: Any) -> Move:
    """Setting `key` to `value`: sent, unless a relaunch runs or the backend cannot (then a relaunch
    in managed mode, else why not)."""
    if state.relaunching:
        return Move(warning=f"a relaunch is running ({state.relaunching}): a moment")
    reason = why_not(backend, key)
    if reason and offers_relaunch(backend, key, state.managed, state.read_only):
        return Move(key, value, relaunch=True)
    if reason:
        return Move(warning=reason, title=f"{vocab.word(key)} cannot change here")
    return Move(key, value)


def send(session: Any, key: str, value: Any) -> tuple[bool, str]:
    """Ask the server for `key` = `value` (blocking: a worker thread calls it): (applied, the reason
    when not). A dead server is a reason here, never an exception."""
    try:
        result = session.set_config({key: value})
        return bool(getattr(result, "ok", result)), str(getattr(result, "reason", "") or "")
    except Exception as exc:   # noqa: BLE001 - said in the knobs panel and a notification
        return False, f"{type(exc).__name__}: {exc}"
