"""The operator's control state and what a knob key press comes to (tuner.core.control): pure logic
over a backend's declared capabilities, so the TUI's screens are handed data, not the app."""

from __future__ import annotations

from probes.names import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK
from tuner.backends.base import Backend, Capabilities
from tuner.core import control
from tuner.core.control import ControlState, Move


class Declared(Backend):
    """A backend that only declares capabilities (what control reads); it serves nothing."""

    kind = "declared"

    def __init__(self, caps: Capabilities, tp_size: int = 2) -> None:
        self._caps, self._tp = caps, tp_size

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def info(self) -> dict:
        return {"tp_size": self._tp}

    def start(self, bus, clock) -> None:
        pass

    def stop(self) -> None:
        pass


def settable(*keys: str, **kw) -> Capabilities:
    """Capabilities that change `keys` live, in either shape of the flag (one `settable` set, or the
    knob table's per-knob `CAN_SET_*` fields): the knob-table issue moves from one to the other."""
    if "settable" in Capabilities.__dataclass_fields__:
        return Capabilities(settable=frozenset(keys), **kw)
    from tuner.core import setting as vocab
    return Capabilities(**{vocab.knob(k).capability: True for k in keys}, **kw)


SGLANG_LIKE = settable(STEPS, reasons={TOPK: "topk needs a relaunch"}, restart_keys=frozenset({TOPK, DRAFT_TOKENS}),
                       live_values={STEPS: (1, 3, 5)}, value_notes={STEPS: {5: "pinned at bs 1-7 only"}})
ACTIVE = {STEPS: 3, TOPK: 1, DRAFT_TOKENS: 4, PLACEMENT: "sharded"}


def test_availability_per_knob_live_relaunch_or_why_not():
    backend = Declared(SGLANG_LIKE)
    plain = ControlState().at(backend, {**ACTIVE, STEPS: 5})
    assert STEPS not in plain.unavailable and plain.relaunch == frozenset()
    assert plain.unavailable[TOPK] == "topk needs a relaunch"
    assert plain.notes == {STEPS: "tiers 1 3 5 · steps 5 pinned at bs 1-7 only"}
    managed = ControlState(managed=True).at(backend, ACTIVE)
    assert managed.relaunch == {TOPK, DRAFT_TOKENS} and TOPK not in managed.unavailable
    assert PLACEMENT in managed.unavailable                       # not a restart key: still why not
    replay = ControlState(read_only=True, managed=True).at(backend, ACTIVE)
    assert replay.relaunch == frozenset() and replay.notes == {}
    nothing = ControlState().at(None, {})
    assert set(nothing.unavailable.values()) == {"no server to change"}


def test_a_knob_press_is_sent_offered_as_a_relaunch_or_said():
    backend = Declared(SGLANG_LIKE)
    state = ControlState(managed=True)
    assert control.knob_move(state, backend, ACTIVE, "steps", 1) == Move(STEPS, 5)       # the next tier
    top = control.knob_move(state, backend, {**ACTIVE, STEPS: 5}, "steps", 1)
    assert top.warning == "steps 5 is the deepest this server can set live (1, 3, 5)" and not top.key
    assert control.knob_move(state, backend, ACTIVE, "topk", 1) == Move(TOPK, 2, relaunch=True)
    said = control.knob_move(ControlState(), backend, ACTIVE, "topk", 1)
    assert (said.warning, said.title) == ("topk needs a relaunch", "topk cannot change here")
    assert control.knob_move(state, backend, {}, "steps", 1).warning == "the server has not reported steps yet"
    assert control.knob_move(state, backend, ACTIVE, "no_such_knob", 1) is None
    busy = control.change(ControlState(relaunching="topk 2"), backend, STEPS, 5)
    assert busy.warning == "a relaunch is running (topk 2): a moment"


def test_send_turns_a_dead_server_into_a_reason():
    class Dead:
        def set_config(self, changes):
            raise ConnectionError("refused")

    class Answers:
        def set_config(self, changes):
            return type("R", (), {"ok": False, "reason": "not pinnable"})()

    assert control.send(Dead(), STEPS, 4) == (False, "ConnectionError: refused")
    assert control.send(Answers(), STEPS, 4) == (False, "not pinnable")
