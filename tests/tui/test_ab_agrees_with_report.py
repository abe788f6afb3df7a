"""One recording, two readers: the TUI's A/B readout after the last change and the report's verdict
on the same two settings say the same thing (one measurement path, tuner.core.windows).

Three recordings: the report's committed one of the real engine (the last change is the fastest
setting against the runner-up), the TUI's (the draft moved to rank 0 and won, and a profiler capture
sits in the after side), and a synthetic one with a server gap after the change.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.report import synthetic
from tuner.app import make_app
from tuner.commands.replay import open_replay
from tuner.core import windows as W
from tuner.core.events import EventKind
from tuner.report import load, summarize
from tuner.core.segments import setting_key
from tuner.report.verdict import compare

from .scenarios import FIXTURE, SIZE

REPORT_FIXTURE = Path(__file__).parents[1] / "report" / "fixtures" / "cpu-engine.db"


def tui_readout(path: Path) -> tuple[object, str]:
    """(the tok/s line's figures, the readout as drawn) with the replay at the recording's end."""
    async def scenario():
        session = open_replay(path, paused=True)
        session.seek(session.backend.start_t + session.backend.length_s)
        app = make_app(session, tick_s=None)
        async with app.run_test(size=SIZE) as pilot:
            app.main.refresh_panels()
            await pilot.pause()
            readout = app.main.query_one("#ab")
            return readout._view, "\n".join(line.plain for line in readout.render().renderables)
    return asyncio.run(scenario())


def report_pair(path: Path):
    """The report's rows for the two settings of the recording's last change, and its summary."""
    s = summarize(load(path))
    change = s.data.events(EventKind.CONFIG_CHANGED)[-1]
    by_key = {r.key: r for r in s.rows}
    return by_key[setting_key(change.data["old"])], by_key[setting_key(change.data["new"])], s


@pytest.mark.parametrize("which", ["report-fixture", "tui-fixture", "synthetic"])
def test_the_tui_ab_and_the_report_agree(which, tmp_path):
    path = {"report-fixture": REPORT_FIXTURE, "tui-fixture": FIXTURE,
            "synthetic": synthetic.write(tmp_path / "synthetic.db")}[which]
    view, drawn = tui_readout(path)
    before, after, summary = report_pair(path)
    assert view.ready, drawn
    tok = view.metrics[0]
    assert tok.name == "vs previous"
    # The same windows on each side, so the same medians, ratio and interval, to the last bit.
    ratio, lo, hi = compare(before, after)
    assert (tok.before, tok.after) == (before.tok_s, after.tok_s)
    assert (tok.ratio, tok.lo, tok.hi) == (ratio, lo, hi)
    # And the same verdict, as each one words it.
    verdict = W.judge(lo, hi)
    assert {W.BETTER: "better", W.WORSE: "worse", W.WITHIN_NOISE: "unclear"}[verdict] in drawn.split("\n")[1]
    v = summary.verdict
    if {v.best.key, v.other.key} == {before.key, after.key}:
        # The report's verdict is about this very pair: the faster one, by the same interval.
        assert v.best is (after if verdict == W.BETTER else before if verdict == W.WORSE else v.best)
        assert ("within noise" in v.sentences[0]) == (verdict == W.WITHIN_NOISE)
        flip = v.best is before
        assert v.ratio == pytest.approx(1 / ratio if flip else ratio, rel=1e-12)
        assert (v.lo, v.hi) == pytest.approx((1 / hi, 1 / lo) if flip else (lo, hi), rel=1e-12)
        assert f"{(v.ratio - 1) * 100:+.1f} %" in v.sentences[0]
    assert which != "report-fixture" or verdict == W.BETTER, "the committed recording's last change won"
    assert math.isfinite(lo)
