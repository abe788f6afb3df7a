"""The TUI states the snapshot tests check and the README's screenshots show, over the committed
recording of the real engine (tests/tui/fixtures/engine.db, made by tests/tui/make_fixture.py).

Each scenario opens the recording paused at a position on its virtual clock, then presses keys.
Nothing depends on the wall clock: times are relative to the recording, the server's version, host
and port come from the recording itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.app import TunerApp, make_app
from tuner.commands.replay import open_replay

FIXTURE = Path(__file__).parent / "fixtures" / "engine.db"
# `tune --out` against the real engine (tests/tui/make_tuning_fixture.py): one verified A/B.
TUNING_FIXTURE = Path(__file__).parent / "fixtures" / "tuning.db"
SIZE = (120, 40)


@dataclass(frozen=True)
class Scenario:
    name: str
    at_s: float
    """Seconds into the recording."""
    press: tuple[str, ...] = ()
    about: str = ""
    fixture: Path = FIXTURE


SCENARIOS = (
    Scenario("main_what_if", 23.0, (),
             "the draft in the TP group: the what-if predicts tok/s with it off the group"),
    Scenario("main_after_placement_change", 36.0, (),
             "after the draft left the TP group: draft collectives gone, A/B readout ready"),
    Scenario("main_not_yet", 14.0, (), "just after a steps change: the A/B readout says not yet"),
    Scenario("trace_analysis", 46.3, ("a",), "the recorded capture's analysis, per rank"),
    Scenario("help", 34.0, ("question_mark",), "the help screen of a replay"),
    Scenario("replay_stepped", 20.0, ("full_stop", "full_stop", "right"),
             "two one-second steps and a 10-s seek"),
    Scenario("tune_recorded", 43.2, ("u",),
             "a recorded tuning: predicted vs measured tok/s, the A/B, the fitted costs",
             TUNING_FIXTURE),
)


def replay_app(scenario: Scenario) -> TunerApp:
    """The app exactly as `specdecode-tune replay FILE --paused --start S` builds it, with no timer."""
    session = open_replay(scenario.fixture, start=scenario.at_s, paused=True)
    app = make_app(session, tick_s=None)
    app.animation_level = "none"
    return app
