"""The knob table is the operator side's one vocabulary: a row added to it (and its name in
probes.names) shows up in the keys, the help, the palette, the knobs panel, the recorded active
config, the report's columns, the tuner's search space and each backend's capabilities.

The row checked is SGLang's `speculative_accept_threshold_single`, a real one: live on SGLang (its own
/set_internal_state takes it), refused by our engine by name. One test drives it end to end: the key,
the request body an SGLang-shaped server (tests/core/core_standin.py, real sockets) receives, the
recorded active value and the report's column.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import math
from pathlib import Path

import pytest
from rich.console import Console

import tuner.app as tapp
from tuner import actions
from tuner.core import setting as vocab
from tuner.core.records import Event
from tuner.core.session import Session
from tuner.screens.help import HelpScreen, keys_table
from tuner.widgets.knobs import KnobsPanel, KnobView

from .helpers import wait_for

_spec = importlib.util.spec_from_file_location(
    "core_standin_for_knob_table", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)

ARG = "speculative_accept_threshold_single"
EXTRA = vocab.knob(ARG)
ACTIVE = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
          "speculative_draft_placement": "sharded", ARG: 0.7}


@pytest.fixture
def extra_knob():
    assert EXTRA is not None and EXTRA.key == "accept_threshold_single"
    return EXTRA


def test_bindings_help_palette_and_panel_carry_the_new_knob(extra_knob):
    class App(tapp.TunerApp):     # the app class as it is made once the table has the row
        BINDINGS = actions.bindings()
        CSS_PATH = str(Path(tapp.__file__).with_name("app.tcss"))

    async def scenario():
        session = Session()
        session.put(Event(session.now(), "server_info", {"kind": "refengine", "active": ACTIVE}))
        app = App(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            app.tick()
            keys = {(k, a, label) for k, a, label in app.key_help()}
            assert {("j", "accept_single", "accept+"), ("J", "accept_single", "accept-")} <= keys
            titles = {c.title for c in app.get_system_commands(app.screen)}
            assert {"Raise the accept threshold", "Lower the accept threshold"} <= titles
            panel = KnobsPanel.markup(app.main.knob_view(ACTIVE)).plain
            assert "accept thr." in panel and "0.7" in panel
            assert "no server to change" in panel.split("accept thr.")[1]      # said why, per knob
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            console = Console(width=200, record=True, file=io.StringIO())
            console.print(keys_table(app.screen._keys))
            line = next(x for x in console.export_text().splitlines() if "acceptance threshold" in x)
            assert line.split()[:2] == ["j", "J"]          # the pair on one line, like + and -
            # The key is bound: without a server it says why instead of sending anything.
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("j")
            await pilot.pause()
            notes = [(n.title, n.message) for n in app._notifications]
            assert ("accept cannot change here", "no server to change") in notes, notes
    asyncio.run(scenario())


def test_the_panel_draws_the_new_knob_with_its_keys(extra_knob):
    text = KnobsPanel.markup(KnobView(vocab.by_arg(ACTIVE))).plain
    line = next(x for x in text.splitlines() if x.startswith("accept thr."))
    assert "0.7" in line and " J " in line and " j " in line


def test_recorded_active_config_and_the_record_progress_carry_it(extra_knob):
    from tuner.backends.common_info import active_knobs
    from tuner.backends.derive import config_of
    from tuner.commands.record import _setting

    assert active_knobs({"internal_states": [ACTIVE]})[ARG] == 0.7
    assert config_of({"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded",
                      "accept_threshold_single": 0.7})[ARG] == 0.7
    assert _setting(ACTIVE).endswith("accept_single=0.7")


def test_report_columns_carry_it(extra_knob):
    from tuner.core.segments import setting_key, setting_label

    key = setting_key(ACTIVE)
    assert key[-1] == 0.7 and len(key) == len(vocab.KNOBS)
    assert setting_label(key) == "steps=3 topk=1 draft_tokens=4 placement=sharded accept_single=0.7"


def test_the_tuners_space_sweeps_it_only_where_the_server_can_change_it(extra_knob):
    from tuner.tuning.observations import parse_record
    from tuner.tuning.settings import tune_space

    everything = tune_space(lambda arg: True, 2)
    values = {s.get(EXTRA) for s in everything if s.steps > 0}
    assert values == {0.5, 1.0}
    s = next(s for s in everything if s.steps == 2 and s.get(EXTRA) == 0.5)
    assert s.as_server_args()[ARG] == 0.5 and vocab.Setting.from_json(s.to_json()) == s
    assert [x for x in everything if x.steps == 0] == [vocab.Setting(0)]     # tier 0 stays one point
    held = tune_space(lambda arg: arg != ARG, 2)
    assert {s.get(EXTRA) for s in held} == {None}
    rec = {"seq": 1, "t": 1.0, "epoch": 1, "steps": 2, "topk": 1, "num_draft_tokens": 3, "placement": "sharded", "bs": 1,
           "wall_ms": 10.0, "phase_ms": {}, "accept_threshold_single": 0.5}
    assert parse_record(rec).setting == s
    from tuner.tuning.export import sglang_flags
    assert sglang_flags(s)[-2:] == ["--speculative-accept-threshold-single", "0.5"]
    with pytest.raises(ValueError, match="outside"):
        vocab.Setting(2, extra=(("accept_threshold_single", 1.5),))
    with pytest.raises(ValueError, match="accept_single must be a number"):      # a bad record is one line
        parse_record({**rec, "accept_threshold_single": "high"})


def test_a_stepped_knob_stays_in_bounds_and_a_cycled_one_wraps():
    steps, placement = vocab.knob("steps"), vocab.knob("placement")
    assert steps.bumped(0, -1) == 0 and steps.bumped(3, 1) == 4 and steps.bumped(None, 1) is None
    assert placement.bumped("rank0", 1) == "sharded" and placement.bumped("?", 1) == "sharded"
    assert EXTRA.bumped(0.7, 1) == 0.8 and EXTRA.bumped(1.0, 1) == 1.0 and EXTRA.bumped(0.0, -1) == 0.0
    assert not math.isnan(EXTRA.bumped(0.2, 1))


def test_no_knob_key_shadows_another_key():
    knob_keys = [k for a in actions.knob_rows() for k in a.keys.split(",")]
    other = [k for a in actions.OTHER_ROWS for k in a.keys.split(",")]
    assert len(set(knob_keys)) == len(knob_keys) and not set(knob_keys) & set(other)


def test_the_table_names_the_shared_knobs_and_every_row_has_a_capability_flag():
    from probes import names
    from tuner.backends.base import Capabilities

    assert vocab.args() == names.KNOBS
    assert vocab.knob(names.PLACEMENT).values is names.PLACEMENTS
    assert [k.arg for k in vocab.KNOBS if k.sglang_live] == [ARG]         # SGLang's own live keys
    assert not hasattr(Capabilities, "CAN_SET_STEPS")                    # one set, no flag per knob
    assert len({k.name for k in vocab.KNOBS}) == len({k.word for k in vocab.KNOBS}) == len(vocab.KNOBS)


def test_sglang_takes_it_live_and_says_which_relaunch_flag_changes_the_others(extra_knob):
    from tuner.backends.sglang import SGLangBackend

    caps = SGLangBackend("http://127.0.0.1:9").capabilities      # nothing is contacted to say this
    assert caps.can_set(ARG) and ARG not in caps.restart_keys       # SGLang takes it live, no plugin needed
    assert not caps.can_set("speculative_eagle_topk")
    assert caps.why_not("speculative_eagle_topk").endswith("relaunch the server with --speculative-eagle-topk N")


def test_a_managed_relaunch_takes_every_knob_move_it_offers(extra_knob, monkeypatch):
    """Each key an SGLang without the plugin offers as a relaunch is one `apply_settings` takes: a
    move to a valid setting relaunches, one the setting's own rules refuse (draft tokens on a chain)
    is refused by value, never as a setting it does not know."""
    from dataclasses import replace

    from tuner.backends.sglang import SGLangBackend
    from tuner.backends.sglang.args import ArgsError, Launch, apply_settings, get_arg, relaunch_keys
    from tuner.core.relaunch import relaunch_changes

    def offered() -> set[str]:
        caps = SGLangBackend("http://127.0.0.1:9").capabilities      # nothing is contacted to say this
        return {k.arg for k in vocab.KNOBS if caps.needs_restart_for(k.arg)}

    def moves(topk: int, n: int) -> int:
        argv = ("python", "-m", "sglang.launch_server", "--model-path", "m", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(n))
        active = {**ACTIVE, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": n, ARG: 0.7}
        taken = 0
        for arg in offered():
            assert arg in relaunch_keys()
            for delta in (1, -1):
                changes = relaunch_changes(arg, vocab.knob(arg).bumped(active[arg], delta), active)
                after = {**active, **changes}
                if after["speculative_eagle_topk"] == 1 and "speculative_num_draft_tokens" not in changes:
                    del after["speculative_num_draft_tokens"]           # a chain's is derived
                valid = vocab.Setting.from_args(after) is not None
                try:
                    new = list(apply_settings(Launch(argv), changes).argv)
                except ArgsError as e:
                    assert not valid and "cannot relaunch" not in str(e), (changes, e)
                    continue
                assert valid and get_arg(new, arg) == str(changes[arg])
                taken += 1
        return taken

    assert offered() == {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"}
    assert moves(1, 4) == 4 and moves(2, 4) == 6            # a chain's d/D are refused by value
    # A row with a launch flag that SGLang does not take live is offered and taken by its row alone.
    monkeypatch.setattr(vocab, "KNOBS", tuple(replace(k, sglang_live=False) if k is EXTRA else k for k in vocab.KNOBS))
    assert ARG in offered() and moves(2, 4) == 8
    assert apply_settings(Launch(("x",)), {ARG: 0.5}).argv == ("x", "--speculative-accept-threshold-single", "0.5")
    with pytest.raises(ArgsError, match="within 0.0..1.0"):
        apply_settings(Launch(("x",)), {ARG: 1.5})


def test_our_engine_declares_its_knobs_and_refuses_this_one_by_name(extra_knob):
    from refengine.server.inputs import BadRequest, parse_internal_state
    from tuner.backends.refengine import RefEngineBackend

    with pytest.raises(BadRequest, match=rf"^Updating {ARG} is not supported\. Supported keys: speculative_num_steps"):
        parse_internal_state({"server_args": {ARG: 0.5}})         # SGLang's refusal, word for word
    b = RefEngineBackend("http://127.0.0.1:9")
    b._info = b.normalize_info({"internal_states": [{"specdecode_knobs": ["speculative_num_steps", "bogus"]}]})
    caps = b.capabilities
    assert caps.settable == {"speculative_num_steps"}
    assert caps.why_not(ARG) == f"the reference engine has no {ARG}"
    b._info = b.normalize_info({"internal_states": [{}]})       # an engine from before it declared them
    assert b.capabilities.settable == {"speculative_num_steps", "speculative_eagle_topk",
                                       "speculative_num_draft_tokens", "speculative_draft_placement"}


def test_j_reaches_sglang_the_recording_and_the_report(extra_knob, tmp_path):
    """key → /set_internal_state body → recorded active value → report column, against an SGLang
    0.5.23 stand-in without the plugin (SGLang takes this knob itself), recorded by a Recorder on the
    TUI's own session."""
    from tuner.backends import connect
    from tuner.core.events import EventKind
    from tuner.recording import Recorder, header_for
    from tuner.report import markdown
    from tuner.report.data import load
    from tuner.report.summary import summarize

    standin = core_standin.StandIn(kind="sglang")
    standin.overrides[ARG] = 0.7          # as if set earlier: j has room to raise it
    standin.start()
    path = tmp_path / "accept.db"

    async def scenario():
        backend = connect(standin.url)
        session = Session(backend, recorder=Recorder(path, header_for(backend, command="test")))
        app = tapp.make_app(session, load=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: session.active_config().get(ARG) == 0.7, why="the first read-back")
            await pilot.press("j")
            await wait_for(pilot, lambda: session.active_config().get(ARG) == 0.8, why="0.8 read back")
            assert standin.posts == [{"server_args": {ARG: 0.8}}]      # the knob's own name, no plugin key
            changed = session.store.last_event(EventKind.CONFIG_CHANGED)
            assert changed is not None and changed.data["new"][ARG] == 0.8
            # The report needs time at the new setting: readings a second past the change.
            await wait_for(pilot, lambda: session.store.t_last >= changed.t + 1.0, why="readings after the change")
        # Leaving the app closed the session, and with it the recording.

    try:
        asyncio.run(scenario())
    finally:
        standin.stop()
    data = load(path)
    assert [e.data["new"][ARG] for e in data.events(EventKind.CONFIG_CHANGED)] == [0.8]
    rows = summarize(data).rows
    assert [r.to_json()["setting"][ARG] for r in rows] == [0.7, 0.8]
    assert "accept_single=0.8" in rows[1].label.split()
    assert "accept_single=0.8" in markdown.render(summarize(data))
