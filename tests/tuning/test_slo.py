"""Tuning for an objective (tuner.tuning.slo): the SLO grammar and its one-line errors, the cost
model's ITL per setting, and the live tuner on the simulated engine choosing under an SLO."""

from __future__ import annotations

import math

import pytest

from tests.tuning.sim import drive, make
from tests.tuning.synth import Truth
from tuner.tuning.cost_model import Prediction
from tuner.tuning.live import TunerOptions
from tuner.tuning.settings import Setting, settings_space
from tuner.tuning.slo import (LATENCY, Objective, SloError, Term, itl_quantile_tokens, itl_values, parse_slo,
                              predicted_itl)


def test_slo_grammar():
    assert parse_slo("itl_p99<=40ms, ttft_p99<=2s") == (Term("itl", 0.99, 0.04), Term("ttft", 0.99, 2.0))
    assert parse_slo("queue_p90<=500us")[0].limit_s == pytest.approx(5e-4)
    for bad, said in (("itl_p99<40ms", "cannot read 'itl_p99<40ms'"), ("tpot_p99<=4ms", "cannot read"),
                      ("itl_p95<=4ms", "cannot read"), ("itl_p99<=40", "cannot read"), ("", "empty"),
                      ("itl_p99<=0ms", "above 0"), ("itl_p99<=4ms,itl_p99<=5ms", "given twice")):
        with pytest.raises(SloError, match=said) as e:
            parse_slo(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(SloError, match="--objective is throughput or latency"):
        Objective("fast")


def test_rate_only_terms_are_judged_only_under_rate():
    slo = parse_slo("itl_p99<=40ms,ttft_p99<=2s")
    closed, open_ = Objective(slo=slo), Objective(slo=slo, open_loop=True)
    assert [t.name for t in closed.judged] == ["itl_p99"] and "judged only under --rate" in closed.describe()
    assert [t.name for t in open_.judged] == ["itl_p99", "ttft_p99"]
    assert closed.meets({"itl_p99": 0.03, "ttft_p99": 9.0}) is True
    assert open_.meets({"itl_p99": 0.03, "ttft_p99": 9.0}) is False
    assert open_.meets({"itl_p99": 0.03}) is None
    assert open_.miss({"itl_p99": 0.05, "ttft_p99": 1.0}) == pytest.approx(0.25)


def test_itl_per_setting_from_iteration_cost_and_acceptance():
    # p = P(accepted >= k): with every draft accepted each output is steps + 1 tokens of T/(steps+1).
    assert itl_quantile_tokens([1.0, 1.0], 2, 0.99) == 3
    # One round in ten accepts nothing: those tokens are 1/(0.1*1 + 0.9*3) = 3.6 % of all, so p99
    # is a 1-token output's T, and p50 a 3-token output's T/3.
    p = [0.9, 0.9]
    assert itl_quantile_tokens(p, 2, 0.99) == 1 and itl_quantile_tokens(p, 2, 0.5) == 3
    pred = Prediction(Setting(2), 4, 100.0, t_ms=30.0, t_sd=3.0)
    v, sd = predicted_itl(pred, p, 0.5)
    assert v == pytest.approx(0.010) and sd == pytest.approx(0.001)
    assert math.isnan(predicted_itl(Prediction(Setting(2), 4, None), p)[0])

    class It:
        wall_ms, accepted = 30.0, (2, 0)
    assert itl_values([It()]) == pytest.approx([0.01] * 3 + [0.03])


def test_pick_meets_the_slo_or_names_the_nearest():
    p = [0.5] * 7
    preds = [Prediction(Setting(s), 2, 100.0 + 10 * s, t_ms=10.0 + 6 * s, t_sd=0.5) for s in (1, 3, 5, 7)]
    top, ok = Objective().pick(preds, p)
    assert top.setting == Setting(7) and ok
    # p99 ITL here is the whole iteration (half the rounds accept nothing): 16, 28, 40, 52 ms.
    pick, ok = Objective(slo=parse_slo("itl_p99<=30ms")).pick(preds, p)
    assert pick.setting == Setting(3) and ok
    pick, ok = Objective(slo=parse_slo("itl_p99<=5ms")).pick(preds, p)
    assert pick.setting == Setting(1) and not ok            # none meets: the nearest, said so
    assert Objective(LATENCY).pick(preds, p)[0].setting == Setting(1)


def test_the_tuner_picks_a_setting_meeting_the_slo():
    """The simulated engine's best-throughput chain is deep and slow per iteration; under an ITL SLO
    of 0.8 x its p99 ITL the tuner leaves it for a shallower setting that meets the SLO, and every
    verdict names its figures."""
    truth = Truth(step=0.6)
    space = settings_space(7)
    clock, engine, session, tuner = make(truth, space, start=Setting(1))
    drive(clock, engine, session, tuner)
    fast = tuner.result.best
    fast_itl = tuner._figures(setting=fast)["itl_p99"]
    slo = parse_slo(f"itl_p99<={fast_itl * 0.8 * 1e3:.3f}ms")
    clock, engine, session, tuner = make(truth, space, TunerOptions(budget_s=600, objective=Objective(slo=slo)),
                                         start=fast)
    drive(clock, engine, session, tuner)
    res = tuner.result
    doc = res.to_json()["objective"]
    assert res.best != fast and doc["met"] is True
    row = next(r for r in doc["settings"] if Setting.from_json(r) == res.best)
    assert row["meets"] and row["figures"]["itl_p99"] <= slo[0].limit_s
    assert row["predicted_itl"] is not None and row["predicted_itl_sd"] is not None
    verified = session.store.events("tuning_verified")
    assert verified and all("candidate_figures" in e.data for e in verified)


def test_an_slo_no_setting_meets_names_the_nearest():
    truth = Truth(step=0.6)
    clock, engine, session, tuner = make(truth, settings_space(3), TunerOptions(
        budget_s=300, objective=Objective(slo=parse_slo("itl_p99<=10us"))), start=Setting(3))
    drive(clock, engine, session, tuner)
    doc = tuner.result.to_json()["objective"]
    assert doc["met"] is False and doc["nearest"]["figures"]["itl_p99"] > 1e-5
    # The tuning ends on the setting it names as the nearest (not on a faster one that misses by more).
    assert Setting.from_json(doc["nearest"]) == tuner.result.best
    said = [e.data["message"] for e in session.store.events("tuning_problem")]
    assert any(m.startswith("no setting measured meets the SLO itl_p99<=10µs; nearest: ") for m in said)


def test_tune_says_a_bad_slo_in_one_line(capsys):
    from tuner.cli import main
    assert main(["tune", "http://127.0.0.1:9", "--slo", "itl_p99<40ms"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--slo: cannot read 'itl_p99<40ms'" in err


def test_the_summary_shows_the_objective_and_the_nearest():
    from tuner.tuning.summary import objective_lines
    obj = {"kind": "throughput", "slo": ["itl_p99<=10µs"], "judged": ["itl_p99"], "met": False,
           "settings": [{**Setting(3).to_json(), "tok_s": 50.0, "figures": {"itl_p99": 0.02}, "meets": False,
                         "predicted_itl": 0.018, "predicted_itl_sd": 0.002}]}
    obj["nearest"] = obj["settings"][0]
    text = "\n".join(objective_lines(obj, Setting(3).to_json()))
    assert "18.0 ± 2.0 ms" in text and "itl_p99 20.0ms" in text and "misses" in text
    assert "no setting measured meets the SLO itl_p99<=10µs; nearest: steps 3" in text


def test_an_itl_slo_is_read_window_after_window():
    # Six windows of 1,000 gaps at 30 ms, one of them with 2 % of its gaps at 40 ms: the pooled p99
    # is 30 ms (0.3 % of all gaps are slow) and meets 31.5 ms; read window by window, one window in
    # six is at 40 ms, and the 90th percentile of the windows' p99s (35 ms) misses it.
    from collections import namedtuple

    from tuner.tuning.slo import measured_itl, windowed_itl
    It = namedtuple("It", "wall_ms accepted")
    iters = [It(30.0, [0])] * 5000 + [It(40.0 if i % 50 == 0 else 30.0, [0]) for i in range(1000)]
    assert measured_itl(iters) == pytest.approx(0.030)
    assert windowed_itl(iters) == pytest.approx(0.035)
    assert windowed_itl(iters[:2000]) == pytest.approx(0.030)         # under 5 windows: the largest
    assert windowed_itl(iters[:10]) == pytest.approx(0.030)           # under one window: pooled
    assert math.isnan(windowed_itl([]))


def test_the_pick_keeps_the_predictions_error_bar_under_the_limit():
    from types import SimpleNamespace as NS
    p = (0.0,)           # nothing accepted: a token per iteration, ITL = the iteration time
    near = NS(setting=NS(steps=1), tok_s=200.0, t_ms=30.0, t_sd=1.0)    # 30 ± 1 ms against 31.5
    safe = NS(setting=NS(steps=0), tok_s=150.0, t_ms=25.0, t_sd=1.0)
    obj = Objective(slo=parse_slo("itl_p99<=31.5ms"))
    assert obj.pick([near, safe], p) == (safe, True)
    assert Objective(slo=parse_slo("itl_p99<=33ms")).pick([near, safe], p) == (near, True)


def test_the_tuning_ends_on_a_measured_setting_that_meets_the_slo():
    # "nearer" verdicts between two settings that miss can end on one that misses while a setting
    # measured earlier met it: that one ends the tuning (the fastest of those that meet).
    obj = Objective(slo=parse_slo("itl_p99<=31.5ms"))
    measured = {"s1 rank0": 123.0, "s3 sharded": 118.0, "s5 rank0": 174.0, "s2 rank0": 130.0}
    itl = {"s1 rank0": 0.023, "s3 sharded": 0.038, "s5 rank0": 0.034, "s2 rank0": 0.031}
    figures = lambda s: {"itl_p99": itl[s]}      # noqa: E731
    assert obj.settle_best("s5 rank0", measured, figures) == "s2 rank0"
    assert obj.settle_best("s1 rank0", measured, figures) == "s1 rank0"       # meets: it stays
    assert Objective().settle_best("s5 rank0", measured, figures) == "s5 rank0"    # no SLO: the verdicts'
    itl.update({"s1 rank0": 0.040, "s2 rank0": 0.040})
    assert obj.settle_best("s5 rank0", measured, figures) == "s5 rank0"       # none meets: the nearest stays
    itl.update({"s5 rank0": 0.045})
    assert obj.settle_best("s5 rank0", measured, figures) == "s3 sharded"     # none meets: the nearest ends it
