"""What must stay on screen in small terminals, read from the drawn screen: at 100x30 the header,
the phase split, the whole A/B panel, the newest 3 events and every footer key; at 80x24 the A/B's
verdict line and the u, ? and q keys. Over the committed recording (the moment of the README's
screenshot) and over a live app's footer (its keys are more than a replay's)."""

from __future__ import annotations

import asyncio

import pytest

from tuner.app import make_app
from tuner.core.session import Session
from tuner.widgets.event_log import render_line

from .helpers import screen_lines
from .scenarios import SCENARIOS, replay_app

MOMENT = next(s for s in SCENARIOS if s.name == "main_100x30")


def drawn(app_factory, size):
    """(the screen's rows, the A/B panel's lines, the event log's newest 3 lines as drawn)."""
    async def run():
        app = app_factory()
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            shown = app.main.query_one("#ab").render()
            ab = [line.plain.rstrip() for line in getattr(shown, "renderables", [shown])]
            events = [render_line(line).plain for line in app.main.query_one("#events").lines[-3:]]
            return screen_lines(app), ab, events
    return asyncio.run(run())


def has(rows, text):
    return any(text in row for row in rows)


def test_100x30_keeps_header_phases_ab_events_and_footer():
    rows, ab, newest = drawn(lambda: replay_app(MOMENT), (100, 30))
    assert len(rows) == 30
    assert rows[0].startswith(" specdecode-tune ▸ refengine") and rows[1].startswith(" active steps 4")
    for text in ("decode iteration", "█ verify", "iteration ", "draft off the TP group"):
        assert has(rows, text), text
    assert len(ab) >= 4
    for line in ab:
        assert has(rows, line), f"A/B line {line!r} is off screen"
    assert has(rows, "b pins")                                  # its subtitle: the baseline
    assert len(newest) == 3
    for line in newest:
        assert has(rows, line[:30]), f"event {line!r} is off screen"
    footer = rows[-1]
    for key in ("a analysis", "space pause", ". step", "← -10s", "→ +10s", "< slower", "> faster",
                "? help", "q quit"):
        assert key in footer, (key, footer)


@pytest.mark.parametrize("size, keys", [
    ((100, 30), ("+ - steps", "t topk+", "d draft+", "p placement", "l load", "c trace", "y py-spy",
                 "a analysis", "u tune", "? help", "q quit")),
    ((80, 24), ("+ - steps", "p placement", "c trace", "u tune", "? help", "q quit")),
])
def test_a_live_footer_fits(size, keys):
    rows = drawn(lambda: make_app(Session(), tick_s=None), size)[0]
    for key in keys:
        assert key in rows[-1], (key, rows[-1])


def test_80x24_keeps_the_ab_verdict_and_u_help_quit():
    rows = drawn(lambda: replay_app(MOMENT), (80, 24))[0]
    verdict = [row for row in rows if "vs previous" in row]
    assert verdict and ("better" in verdict[0] or "worse" in verdict[0] or "unclear" in verdict[0]), rows
    assert "? help" in rows[-1] and "q quit" in rows[-1]
