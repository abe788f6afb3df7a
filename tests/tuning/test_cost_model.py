"""The cost model recovers known costs and acceptance, predicts unprobed settings, finds the optimum."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tuning.synth import Stream, Truth
from tuner.tuning.cost_model import best, fit_from_records, recommend
from tuner.tuning.settings import Setting, settings_space

CHAIN_PROBES = [Setting(0), Setting(1), Setting(3), Setting(7)]


def _records(truth: Truth, probes, n=60, bs=1, noise=0.0, seed=0):
    stream = Stream(truth, seed=seed, noise=noise)
    out = []
    for s in probes:
        out += stream.records(s, n, bs)
    return out


def test_noise_free_fit_recovers_the_costs_and_predicts_unprobed_chains():
    truth = Truth()
    model = fit_from_records(_records(truth, CHAIN_PROBES, n=400), warmup_iters=20, warmup_s=0)
    g = model.groups[("sharded", 1)]
    step, _ = g.terms["draft"].coefficient("s-1")
    assert step == pytest.approx(truth.step, rel=1e-6)
    slope, _ = g.terms["verify"].coefficient("N")
    assert slope == pytest.approx(truth.verify_n, rel=1e-6)
    for s in range(1, 8):
        p = model.predict(Setting(s), 1)
        # τ comes from sampled acceptance, so allow its sampling error.
        assert p.tok_s == pytest.approx(truth.tok_s(Setting(s), 1), rel=0.05), s
        assert p.basis == "fitted"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=st.floats(0.05, 5.0), verify_n=st.floats(0.0, 2.0), verify0=st.floats(0.5, 20.0),
       extend_n=st.floats(0.0, 0.5), sched=st.floats(0.0, 3.0))
def test_fit_recovers_any_linear_costs(step, verify_n, verify0, extend_n, sched):
    truth = Truth(step=step, verify_n=verify_n, verify0=verify0, extend_n=extend_n, sched=sched)
    model = fit_from_records(_records(truth, CHAIN_PROBES, n=30), warmup_iters=0, warmup_s=0)
    g = model.groups[("sharded", 1)]
    assert g.terms["draft"].coefficient("s-1")[0] == pytest.approx(step, rel=1e-6, abs=1e-9)
    assert g.terms["verify"].coefficient("N")[0] == pytest.approx(verify_n, rel=1e-6, abs=1e-9)
    assert g.terms["draft_extend"].coefficient("N")[0] == pytest.approx(extend_n, rel=1e-6, abs=1e-9)
    assert g.terms["sched"].coefficient("1")[0] == pytest.approx(sched, rel=1e-6, abs=1e-9)
    for s in range(1, 8):
        pred = model.predict(Setting(s), 1)
        assert pred.t_ms == pytest.approx(sum(truth.terms(Setting(s)).values()), rel=1e-6)


@settings(max_examples=20, deadline=None)
@given(step=st.floats(0.05, 8.0), p1=st.floats(0.3, 0.98), decay=st.floats(0.4, 0.98))
def test_optimum_is_found(step, p1, decay):
    p = tuple(p1 * decay ** k for k in range(7))
    truth = Truth(step=step, p=p)
    # Plenty of rounds so the sampled acceptance is close to p; noise-free costs.
    model = fit_from_records(_records(truth, CHAIN_PROBES, n=1500, bs=4), warmup_iters=0, warmup_s=0)
    space = settings_space(7)
    pick = best(model.predict_all(space, 4))
    true_best = max(truth.tok_s(s, 4) for s in space)
    # The pick is within the acceptance sampling error of the true optimum.
    assert truth.tok_s(pick.setting, 4) >= 0.97 * true_best


def test_tau_and_time_are_monotone_in_steps():
    truth = Truth()
    model = fit_from_records(_records(truth, CHAIN_PROBES, noise=0.05, seed=3), warmup_iters=5,
                             warmup_s=0)
    preds = [model.predict(Setting(s), 1) for s in range(1, 8)]
    taus = [p.tau for p in preds]
    times = [p.t_ms for p in preds]
    assert taus == sorted(taus)
    assert times == sorted(times)
    assert all(p.sd > 0 for p in preds)


def test_uncertainty_covers_the_truth():
    truth = Truth()
    misses = 0
    total = 0
    for seed in range(8):
        model = fit_from_records(_records(truth, CHAIN_PROBES, n=80, noise=0.08, seed=seed),
                                 warmup_iters=10, warmup_s=0)
        for s in range(1, 8):
            pred = model.predict(Setting(s), 1)
            total += 1
            if abs(pred.tok_s - truth.tok_s(Setting(s), 1)) > 3 * pred.sd:
                misses += 1
    assert misses <= total * 0.05


def test_steps_zero_is_measured_or_extrapolated():
    truth = Truth()
    with_off = fit_from_records(_records(truth, CHAIN_PROBES), warmup_iters=0, warmup_s=0)
    p = with_off.predict(Setting(0), 1)
    assert p.basis == "measured"
    assert p.tok_s == pytest.approx(truth.tok_s(Setting(0), 1), rel=1e-6)
    without = fit_from_records(_records(truth, CHAIN_PROBES[1:]), warmup_iters=0, warmup_s=0)
    q = without.predict(Setting(0), 1)
    assert q.basis == "extrapolated" and q.tok_s is not None and q.sd > p.sd


def test_trees_need_a_measured_sibling():
    truth = Truth()
    probes = CHAIN_PROBES + [Setting(3, 4, 8)]
    model = fit_from_records(_records(truth, probes, n=200), warmup_iters=0, warmup_s=0)
    measured = model.predict(Setting(3, 4, 8), 1)
    assert measured.basis == "fitted"  # costs fitted, τ measured
    assert measured.tau == pytest.approx(truth.tau(Setting(3, 4, 8)), rel=0.05)
    sibling = model.predict(Setting(5, 4, 12), 1)
    assert sibling.tok_s is not None and sibling.basis == "extrapolated"
    # Its cost uses the fitted per-branch term.
    assert sibling.t_ms == pytest.approx(sum(truth.terms(Setting(5, 4, 12)).values()), rel=0.02)
    other_k = model.predict(Setting(3, 2, 6), 1)
    assert other_k.tok_s is None and "tree acceptance" in other_k.reason
    chains_only = fit_from_records(_records(truth, CHAIN_PROBES), warmup_iters=0, warmup_s=0)
    refused = chains_only.predict(Setting(3, 4, 8), 1)
    assert refused.tok_s is None and refused.reason


def test_what_if_removes_the_draft_collectives():
    truth = Truth(comm_share=0.6)
    model = fit_from_records(_records(truth, CHAIN_PROBES, n=100), tp_size=2, warmup_iters=0,
                             warmup_s=0)
    s = Setting(5)
    w = model.what_if(s, 1, "replicated")
    assert w.comm_share == pytest.approx(0.6, rel=1e-6)
    true_t = sum(truth.terms(Setting(5, placement="replicated")).values())
    # High estimate keeps the compute: the truth plus the one broadcast of draft tokens it keeps.
    per_call = model.groups[("sharded", 1)].comm_per_call
    assert 0 < per_call < 0.5
    assert w.t_ms == pytest.approx(true_t + per_call, rel=1e-6)
    assert w.tok_s_low < w.tok_s and w.tok_s > w.tok_s_now
    pred = model.predict(Setting(5, placement="replicated"), 1)
    assert pred.basis == "what-if" and pred.tok_s == pytest.approx(w.tok_s)


def test_untimed_collectives_make_no_what_if():
    """A record whose comm_ms lacks a phase (collectives inside CUDA graphs, SGLang's plugin)
    says "not measured": the what-if must be unknown, not a free move off the TP group."""
    truth = Truth(comm_share=0.6)
    records = _records(truth, CHAIN_PROBES, n=100)
    for r in records:
        r["comm_ms"] = {k: v for k, v in r["comm_ms"].items() if k not in ("draft", "draft_extend")}
    model = fit_from_records(records, tp_size=2, warmup_iters=0, warmup_s=0)
    assert model.what_if(Setting(5), 1, "replicated") is None
    assert model.predict(Setting(5), 1).tok_s is not None  # the costs themselves still fit


def test_measured_placement_is_fitted_not_what_if():
    truth = Truth(comm_share=0.6)
    probes = CHAIN_PROBES + [Setting(s, placement="replicated") for s in (1, 4, 7)]
    model = fit_from_records(_records(truth, probes, n=100), warmup_iters=0, warmup_s=0)
    p = model.predict(Setting(3, placement="replicated"), 1)
    assert p.basis == "fitted"
    assert p.t_ms == pytest.approx(sum(truth.terms(Setting(3, placement="replicated")).values()),
                                   rel=1e-6)
    space = settings_space(7, placements=("sharded", "replicated"))
    rec = recommend(model, space)
    assert rec[1].setting.placement == "replicated"


def test_per_batch_size_groups():
    truth = Truth()
    stream = Stream(truth)
    recs = []
    for bs in (1, 8):
        for s in CHAIN_PROBES:
            recs += stream.records(s, 40, bs)
    model = fit_from_records(recs, warmup_iters=0, warmup_s=0)
    assert model.batch_sizes() == [1, 8]
    assert model.predict(Setting(3), 8).tok_s == pytest.approx(8 * model.predict(Setting(3), 1).tok_s,
                                                                rel=0.1)
    assert model.predict(Setting(3), 4).tok_s is None


def test_model_json_is_plain_json():
    import json

    truth = Truth()
    model = fit_from_records(_records(truth, CHAIN_PROBES + [Setting(3, 4, 8)]), tp_size=2,
                             warmup_iters=0, warmup_s=0)
    doc = json.loads(json.dumps(model.to_json()))
    assert doc["version"] == 1
    g = doc["groups"][0]
    assert g["terms"]["draft"]["coef"]["s-1"]["value"] == pytest.approx(truth.step, rel=1e-6)
    assert g["terms"]["draft"]["coef"]["(s-1)(k-1)"]["value"] == pytest.approx(truth.branch, rel=1e-6)
    assert len(doc["acceptance"]["p"]) == 7
    pred = model.predict(Setting(2), 1).to_json()
    assert json.loads(json.dumps(pred))["tok_s"] > 0
    assert not any(isinstance(v, float) and math.isnan(v) for v in pred.values())


def test_prefill_is_a_per_iteration_load_cost_apart_from_sched():
    truth = Truth(prefill=1.5)
    records = _records(truth, CHAIN_PROBES, n=40)
    model = fit_from_records(records, warmup_iters=0, warmup_s=0)
    g = model.groups[("sharded", 1)]
    assert g.terms["prefill"].coefficient("1")[0] == pytest.approx(1.5, rel=1e-6)
    assert g.terms["sched"].coefficient("1")[0] == pytest.approx(truth.sched, rel=1e-6)
    assert g.off["prefill"][0] == pytest.approx(1.5, rel=1e-6)
    for s in (Setting(0), Setting(2), Setting(5)):
        pred = model.predict(s, 1)
        assert pred.terms_ms["prefill"][0] == pytest.approx(1.5, rel=1e-6)
        assert pred.t_ms == pytest.approx(sum(truth.terms(s).values()), rel=1e-6)
    # A recording from before prefill was a phase: its time sat in `other`, so it is in sched.
    for r in records:
        r["phase_ms"]["other"] += r["phase_ms"].pop("prefill")
    old = fit_from_records(records, warmup_iters=0, warmup_s=0).groups[("sharded", 1)]
    assert old.terms["prefill"].coefficient("1")[0] == 0.0
    assert old.terms["sched"].coefficient("1")[0] == pytest.approx(truth.sched + 1.5, rel=1e-6)


def test_fitted_costs_print_prefill_only_when_the_model_has_it():
    from tuner.tuning.summary import costs
    doc = fit_from_records(_records(Truth(prefill=1.5), CHAIN_PROBES, n=40), warmup_iters=0, warmup_s=0).to_json()
    [line] = [ln for ln in costs(doc, 1) if "sharded" in ln]
    assert "; prefill 1.500 ± " in line
    for g in doc["groups"]:     # a model saved before prefill was a term: nothing about it, no error
        del g["terms"]["prefill"]
    assert not any("prefill" in ln for ln in costs(doc, 1))


def test_sporadic_prefill_is_the_mean_over_every_iteration_even_where_a_probe_saw_none():
    # Admissions come now and then: 4 ms every 4th iteration at two settings, none while the third
    # was probed. A 1/se²-weighted fit would follow the 0 ± 0 probe; the load cost is the mean.
    import random
    rng = random.Random(7)
    records = _records(Truth(), CHAIN_PROBES[1:], n=80)
    for r in records:
        pre = 4.0 if r["steps"] in (1, 3) and rng.random() < 0.25 else 0.0
        r["phase_ms"]["prefill"] = pre
        r["wall_ms"] += pre
    g = fit_from_records(records, warmup_iters=0, warmup_s=0).groups[("sharded", 1)]
    got, se = g.terms["prefill"].coefficient("1")
    want = sum(r["phase_ms"]["prefill"] for r in records) / len(records)
    assert 0.4 < want and got == pytest.approx(want, rel=1e-6)
    assert se > 0.1                                          # the settings disagree: an honest error
    assert g.terms["sched"].coefficient("1")[0] == pytest.approx(Truth().sched, rel=1e-6)
