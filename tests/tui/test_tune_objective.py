"""The TUI's tune key under an objective: attach's --tune-objective/--tune-slo reach the tuner the
key starts, and the tune screen's view says what it judges and, once finished, each measured
setting's predicted and measured latency and whether it met the SLO (the `tune` command's lines)."""

from __future__ import annotations

import argparse

import pytest

from tuner.app import make_app
from tuner.commands.options import OpenError, add_load_arguments, add_tui_tune_arguments, tui_inputs
from tuner.core.session import Session
from tuner.tuning.slo import Objective, parse_slo
from tuner.widgets.tune_view import build_view

STEPS3 = {"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded"}
STEPS1 = {"steps": 1, "topk": 1, "num_draft_tokens": 2, "placement": "sharded"}


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_load_arguments(p, tui=True)
    add_tui_tune_arguments(p)
    return p.parse_args(list(argv))


def test_the_flags_reach_the_tune_keys_request():
    _, tune = tui_inputs(parse("--rate", "2", "--tune-slo", "itl_p99<=40ms,ttft_p99<=2s"))
    obj = tune["tune_objective"]
    assert obj == Objective("throughput", parse_slo("itl_p99<=40ms,ttft_p99<=2s"), open_loop=True)
    assert make_app(Session(), tick_s=None, **tune).tune.objective == obj
    assert tui_inputs(parse("--tune-objective", "latency"))[1]["tune_objective"].kind == "latency"
    with pytest.raises(OpenError) as e:
        tui_inputs(parse("--tune-slo", "itl<=4"))
    assert e.value.rc == 2 and str(e.value).startswith("--tune-slo: cannot read") and "\n" not in str(e.value)


def test_the_view_says_the_objective_and_each_settings_latency():
    running = build_view({"objective_text": "tok/s subject to itl_p99<=40ms"}, state="running")
    assert running.objective == ("objective: tok/s subject to itl_p99<=40ms",)
    obj = {**Objective("throughput", parse_slo("itl_p99<=40ms")).to_json(), "met": True, "settings": [
        {**STEPS3, "tok_s": 120.0, "figures": {"itl_p99": 0.050}, "meets": False,
         "predicted_itl": 0.048, "predicted_itl_sd": 0.004},
        {**STEPS1, "tok_s": 90.0, "figures": {"itl_p99": 0.030}, "meets": True,
         "predicted_itl": 0.031, "predicted_itl_sd": 0.002}]}
    done = build_view({"objective": obj, "best": STEPS1, "predictions": []}, state="done")
    text = "\n".join(done.objective)
    assert "SLO itl_p99<=40ms" in text and "48.0 ± 4.0 ms" in text and "itl_p99 30.0ms" in text
    assert [line.split()[-1] for line in done.objective[2:]] == ["misses", "meets"]
    assert build_view({}, state="idle").objective == ()
