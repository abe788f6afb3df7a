"""The TUI states the snapshot tests check and the README's screenshots show, over the committed
recording of the real engine (tests/tui/fixtures/engine.db, made by tests/tui/make_fixture.py).

Each scenario opens the recording paused at a position on its virtual clock, then presses keys. A
scenario's caption is the README's alt text for its image (make_screenshots writes it there); what
the caption claims about the A/B is data (`Claim`), checked against the recording.
Nothing depends on the wall clock: times are relative to the recording, the server's version, host
and port come from the recording itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.app import TunerApp, make_app
from tuner.commands.replay import open_replay
from tuner.core import windows as W

FIXTURE = Path(__file__).parent / "fixtures" / "engine.db"
# `tune --out` against the real engine (tests/tui/make_tuning_fixture.py): one verified A/B.
TUNING_FIXTURE = Path(__file__).parent / "fixtures" / "tuning.db"
SIZE = (120, 40)


@dataclass(frozen=True)
class Claim:
    """What a screenshot's caption says the A/B shows, as data: the A/B code computes the verdict
    from the recording (tests/tui/test_screenshot_claims.py) and it must be this one."""

    metric: str
    """"tok/s" or "accept len"."""
    verdict: str
    """tuner.core.windows' BETTER, WORSE or WITHIN_NOISE."""
    against: str = "previous"
    """"previous" (the last change) or "baseline" (the setting at the recording's start)."""

    def words(self) -> str:
        return f"{self.metric} {self.verdict} vs the {self.against} setting"


@dataclass(frozen=True)
class Scenario:
    name: str
    at_s: float
    """Seconds into the recording."""
    press: tuple[str, ...] = ()
    about: str = ""
    """What the image shows, in words; with the claims, the README's alt text (caption)."""
    fixture: Path = FIXTURE
    claims: tuple[Claim, ...] = ()
    size: tuple[int, int] = SIZE

    @property
    def caption(self) -> str:
        said = ", ".join(c.words() for c in self.claims)
        return f"{self.about}. A/B: {said}" if said else self.about


AFTER_PLACEMENT_S = 42.0
"""In engine.db: 16 s after the draft moved to rank 0 (at 26 s), before the capture (44 s)."""
PLACEMENT_WINS = (Claim("tok/s", W.BETTER), Claim("tok/s", W.BETTER, "baseline"))

SCENARIOS = (
    Scenario("main_what_if", 25.0, (),
             "the draft sharded over the TP group: the what-if predicts tok/s for rank0 and replicated"),
    Scenario("main_after_placement_change", AFTER_PLACEMENT_S, (),
             "after moving the draft off the TP group to rank 0, its collectives gone", claims=PLACEMENT_WINS),
    Scenario("main_not_yet", 14.0, (), "just after a steps change: the A/B readout says not yet"),
    Scenario("trace_analysis", 49.5, ("a",), "the recorded capture's analysis, per rank"),
    Scenario("help", 34.0, ("question_mark",), "the help screen of a replay"),
    Scenario("replay_stepped", 20.0, ("full_stop", "full_stop", "right"),
             "a replay after two one-second steps and a 10-s seek"),
    Scenario("tune_recorded", 43.2, ("u",),
             "a recorded tuning: predicted vs measured tok/s, the A/B, the fitted costs",
             TUNING_FIXTURE),
    Scenario("main_100x30", AFTER_PLACEMENT_S, (), "the same moment in a 100x30 terminal", claims=PLACEMENT_WINS,
             size=(100, 30)),
    Scenario("main_80x24", AFTER_PLACEMENT_S, (), "the same moment in an 80x24 terminal", size=(80, 24)),
)


def replay_app(scenario: Scenario) -> TunerApp:
    """The app exactly as `specdecode-tune replay FILE --paused --start S` builds it, with no timer."""
    session = open_replay(scenario.fixture, start=scenario.at_s, paused=True)
    app = make_app(session, tick_s=None)
    app.animation_level = "none"
    return app
