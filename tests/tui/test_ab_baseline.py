"""The A/B panel compares the setting running now with the previous one and with the baseline: the
setting at attach (a replay: at the recording's start) until b pins the one running now. Over the
committed recording: steps 3→4 at 12 s, then the draft to rank0 at 26 s."""

from __future__ import annotations

import asyncio

from tuner.widgets.fmt import rel_time

from .scenarios import AFTER_PLACEMENT_S, SCENARIOS, replay_app

MOMENT = next(s for s in SCENARIOS if s.name == "main_after_placement_change")


def panel(app) -> tuple[str, str]:
    readout = app.main.query_one("#ab")
    shown = readout.render()
    text = "\n".join(line.plain for line in getattr(shown, "renderables", [shown]))
    return text, str(app.main.query_one("#ab-panel").border_subtitle)


def test_baseline_row_then_b_pins_the_setting_running_now():
    async def run():
        app = replay_app(MOMENT)
        async with app.run_test(size=MOMENT.size) as pilot:
            await pilot.pause()
            before, subtitle = panel(app)
            base_at, _ = app.main.baseline(app.session.now())
            result = app.session.ab(now=app.session.now(), baseline_at=base_at)
            await pilot.press("b")
            await pilot.pause()
            after, pinned = panel(app)
            notes = [n.message for n in app._notifications]
            return before, subtitle, result, after, pinned, notes
    before, subtitle, result, after, pinned, notes = asyncio.run(run())
    # Before b: rank0 (steps 4) against where the recording started (steps 3, sharded).
    assert subtitle == "base s3 k1 N4 sharded (start) · b pins"
    row = next(line for line in before.splitlines() if line.startswith("vs baseline"))
    assert f"{(result.ratio - 1) * 100:+.1f}%" in row and f"{result.median_before:.1f}" in row
    # b pins rank0, which is the setting running now: nothing to compare it with yet.
    assert any("A/B baseline: s4 k1 N5 rank0" in n for n in notes), notes
    assert pinned.startswith(f"base s4 k1 N5 rank0 (pinned {rel_time(AFTER_PLACEMENT_S)})")
    assert "vs baseline is the setting running now" in after
