"""The README's screenshots say what their recording shows: each scenario's claim about the A/B
(metric, verdict, against what) is computed from the committed recording through the A/B code the
TUI draws with, and the README's alt text is the scenario's caption (make_screenshots writes it)."""

from __future__ import annotations

import asyncio

import pytest

from tuner.core import windows as W

from .make_screenshots import README, with_captions
from .scenarios import SCENARIOS, replay_app

SERIES = {"tok/s": None, "accept len": "spec/accept_len"}     # None: the A/B's own tok/s choice
WORD = {W.BETTER: "better", W.WORSE: "worse", W.WITHIN_NOISE: "unclear"}
CLAIMED = [(s, c) for s in SCENARIOS for c in s.claims]


@pytest.mark.parametrize("scenario,claim", CLAIMED, ids=[f"{s.name}-{c.metric}-{c.against}" for s, c in CLAIMED])
def test_the_caption_claims_what_the_ab_computes(scenario, claim):
    async def run():
        app = replay_app(scenario)
        async with app.run_test(size=scenario.size) as pilot:
            await pilot.pause()
            now = app.session.now()
            base_at = app.main.baseline(now)[0] if claim.against == "baseline" else None
            result = app.session.ab(SERIES[claim.metric], now=now, baseline_at=base_at)
            assert result.ready, f"{scenario.name}: the A/B is {result.text()} at {scenario.at_s} s"
            verdict = W.judge(result.lo, result.hi)
            drawn = "\n".join(line.plain for line in app.main.query_one("#ab").render().renderables)
            return verdict, result, drawn
    verdict, result, drawn = asyncio.run(run())
    assert verdict == claim.verdict, f"{scenario.name} claims {claim.words()}, the A/B says {verdict}: {result.text()}"
    row = {"previous": "vs previous", "baseline": "vs baseline"}[claim.against] if claim.metric == "tok/s" \
        else claim.metric
    line = next(line for line in drawn.splitlines() if line.startswith(row))
    assert line.rstrip().endswith(WORD[verdict]), drawn


def test_the_readme_alt_text_is_each_scenarios_caption():
    text = README.read_text(encoding="utf-8")
    assert with_captions(text) == text, "run python -m tests.tui.make_screenshots"
    images = [s for s in SCENARIOS if f"](screenshots/{s.name}.png)" in text and f"![specdecode-tune, {s.caption}]" in text]
    assert any(s.claims for s in images), "the README shows a screenshot whose caption claims an A/B verdict"
