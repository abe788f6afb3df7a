"""The action table (tuner.actions) is where keys, palette, help and mode gating come from: each
action is allowed in exactly its mode, the palette offers what the keys do, the help explains every
key, and the knob rows follow the knob table."""

from __future__ import annotations

from tuner import actions
from tuner.core import setting as vocab

LIVE = dict(read_only=False, tuning_on_screen=False, relaunching=False)
REPLAY = dict(read_only=True, tuning_on_screen=False, relaunching=False)


def test_each_action_works_in_its_mode_only():
    controls = {"knob", "toggle_load", "capture_trace", "pyspy"}
    replay = {"pause", "step", "seek", "speed"}
    for name in controls:
        assert actions.allowed(name, **LIVE) and not actions.allowed(name, **REPLAY)
        assert not actions.allowed(name, **{**LIVE, "tuning_on_screen": True})    # the tuner owns the setting
        assert not actions.allowed(name, **{**LIVE, "relaunching": True})
    for name in replay:
        assert actions.allowed(name, **REPLAY) and not actions.allowed(name, **LIVE)
    assert not actions.allowed("tune", **{**LIVE, "relaunching": True}) and actions.allowed("tune", **REPLAY)
    for name in ("help", "quit", "analysis", "pin_baseline", "dismiss"):
        assert actions.allowed(name, **{**LIVE, "relaunching": True, "tuning_on_screen": True})


def test_the_palette_offers_the_keys_of_the_mode():
    live = [a.title for a in actions.palette(read_only=False, recorded_tuning=False)]
    knob_titles = [t for k in vocab.knobs() for t in k.palette]
    assert live[:len(knob_titles)] == knob_titles
    assert live[-6:] == ["Toggle the load driver", "Capture a trace", "Sample Python stacks (py-spy)", "Tune",
                         "Trace analysis", "Keys and panels"]
    replay = [a.title for a in actions.palette(read_only=True, recorded_tuning=False)]
    assert "Tune" not in replay and "Seek 10 s back" in replay and "Capture a trace" not in replay
    assert "Tune" in [a.title for a in actions.palette(read_only=True, recorded_tuning=True)]


def test_every_key_has_a_help_sentence_and_one_binding():
    helps = actions.action_help()
    keys = actions.key_help(**LIVE)
    assert keys[-1] == ("ctrl+p", "command_palette", "palette")
    assert all(helps.get(action) for _, action, _ in keys)
    assert [b.action for b in actions.bindings()] == [a.action for a in actions.actions()]
    bound = [k for a in actions.actions() for k in a.keys.split(",")]
    assert len(bound) == len(set(bound))
