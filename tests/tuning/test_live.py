"""The live tuner's state machine on a simulated engine behind the real Session (injected clock)."""

import json
import math

import pytest

from tests.tuning.sim import SimBackend, SimEngine, SimFeed, drive, make
from tests.tuning.synth import Truth
from tuner.core.clock import ManualClock
from tuner.core.records import thaw
from tuner.core.session import Session
from tuner.core.events import TuningKind
from tuner.tuning.live import InlineRunner, Tuner, TunerOptions, TuningError, probe_plan
from tuner.tuning.settings import Setting, settings_space

SPACE = settings_space(7)


def kinds(session):
    return [e.kind for e in session.store.events() if e.kind.startswith("tuning_")]


def test_probe_plan_starts_with_the_starting_setting_and_a_second_depth():
    plan = probe_plan(SPACE, Setting(3))
    assert plan == [Setting(3), Setting(7)]
    assert probe_plan(SPACE, Setting(7)) == [Setting(7), Setting(1)]
    tree_space = settings_space(5, topks=(1, 4), draft_tokens=(8, 16))
    assert any(s.topk == 4 for s in probe_plan(tree_space, Setting(2)))


def test_tuner_finds_the_best_chain_and_verifies_it():
    truth = Truth(step=0.6)
    clock, engine, session, tuner = make(truth, SPACE, start=Setting(1))
    took = drive(clock, engine, session, tuner)
    res = tuner.result
    true_best = max(SPACE, key=lambda s: truth.tok_s(s, 2))
    assert truth.tok_s(res.best, 2) >= 0.97 * truth.tok_s(true_best, 2)
    assert engine.setting == res.best == res.applied
    ks = kinds(session)
    assert ks[0] == TuningKind.STARTED and ks[-1] == TuningKind.FINISHED
    assert TuningKind.PREDICTION in ks and TuningKind.APPLIED in ks and TuningKind.VERIFIED in ks
    v = res.verifications[0]
    assert v.incumbent == Setting(1) and v.verdict == "better"
    # The measured gain agrees with the prediction within the A/B interval (+ a little).
    assert v.lo - 0.05 <= v.predicted_ratio <= v.hi + 0.05
    # Far less time than measuring every setting the same way (8 settings × (2 s settle + 3 s)).
    assert took < 8 * 5 * 3
    doc = json.loads(json.dumps(thaw(session.store.events(TuningKind.FINISHED)[0].data)))
    assert doc["best"] == res.best.to_json() and doc["model"]["version"] == 1
    assert doc["sglang"]["adaptive_config"]["1"]["candidate_steps"] == [res.best.steps]


def test_slow_link_moves_the_draft_off_the_tp_group():
    truth = Truth(step=2.0, draft0=1.0, comm_share=0.7)
    space = settings_space(7, placements=("sharded", "replicated"))
    clock, engine, session, tuner = make(truth, space, start=Setting(5))
    drive(clock, engine, session, tuner)
    res = tuner.result
    assert res.best.placement == "replicated"
    true_best = max(space, key=lambda s: truth.tok_s(s, 2))
    assert truth.tok_s(res.best, 2) >= 0.97 * truth.tok_s(true_best, 2)
    probes = [thaw(e.data)["setting"] for e in session.store.events(TuningKind.PROBE)]
    assert any(p["placement"] == "replicated" for p in probes)


def test_slow_link_proposes_after_three_probes_and_completes_the_table_after():
    """The what-if from the starting setting sends the probes to the other placement at once; the
    starting placement's second depth waits until the proposal is verified (it could not change it)."""
    truth = Truth(step=2.0, draft0=1.0, comm_share=0.7)
    space = settings_space(7, placements=("sharded", "replicated"))
    clock, engine, session, tuner = make(truth, space, start=Setting(5))
    drive(clock, engine, session, tuner)
    evs = [e for e in session.store.events() if e.kind.startswith("tuning_")]
    first = next(i for i, e in enumerate(evs) if e.kind == TuningKind.APPLIED)
    before = [thaw(e.data)["setting"] for e in evs[:first] if e.kind == TuningKind.PROBE]
    assert [(p["steps"], p["placement"]) for p in before] == [(5, "sharded"), (7, "replicated"),
                                                              (1, "replicated")]
    assert thaw(evs[first].data)["setting"]["placement"] == "replicated"
    after = [thaw(e.data)["setting"] for e in evs[first:]
             if e.kind == TuningKind.PROBE and thaw(e.data)["purpose"] == "probe"]
    assert [(p["steps"], p["placement"]) for p in after] == [(7, "sharded")]
    res = tuner.result
    true_best = max(space, key=lambda s: truth.tok_s(s, 2))
    assert truth.tok_s(res.best, 2) >= 0.97 * truth.tok_s(true_best, 2)
    # Every setting has a prediction at the end (the SGLang export's sharded chains are fitted).
    assert all(p.tok_s is not None for p in res.predictions)


def test_with_collectives_inside_cuda_graphs_the_other_placements_are_measured():
    """On a GPU server with graphs the draft's collectives have no time, so no what-if can say
    whether leaving the TP group pays: the tuner must measure the other placements, not skip them
    as if the collectives were free."""
    truth = Truth(step=2.0, draft0=1.0, comm_share=0.7)
    space = settings_space(7, placements=("sharded", "replicated"))
    clock, engine, session, tuner = make(truth, space, start=Setting(5), graphs=True)
    drive(clock, engine, session, tuner)
    probes = [thaw(e.data)["setting"] for e in session.store.events(TuningKind.PROBE)]
    assert any(p["placement"] == "replicated" for p in probes)
    res = tuner.result
    assert res.best.placement == "replicated"
    true_best = max(space, key=lambda s: truth.tok_s(s, 2))
    assert truth.tok_s(res.best, 2) >= 0.97 * truth.tok_s(true_best, 2)


def test_a_worse_candidate_is_rolled_back():
    truth = Truth(step=0.6)
    true_best = max(SPACE, key=lambda s: truth.tok_s(s, 2))
    # The predicted best is secretly slow (something the linear costs cannot know).
    clock, engine, session, tuner = make(truth, SPACE, start=Setting(1), penalty={true_best: 1.6})
    drive(clock, engine, session, tuner)
    assert TuningKind.ROLLED_BACK in kinds(session)
    res = tuner.result
    assert res.best != true_best and engine.setting == res.best
    assert any(v.setting == true_best and v.verdict == "worse" for v in res.verifications)


def test_refused_setting_is_skipped():
    truth = Truth()
    clock, engine, session, tuner = make(truth, SPACE, start=Setting(2), refuse={Setting(0)})
    drive(clock, engine, session, tuner)
    refused = [thaw(e.data) for e in session.store.events(TuningKind.REFUSED)]
    assert refused and refused[0]["setting"]["steps"] == 0 and "refused" in refused[0]["reason"]
    assert tuner.state == "done"


def test_without_apply_the_starting_setting_is_restored():
    truth = Truth(step=0.6)
    clock, engine, session, tuner = make(truth, SPACE, TunerOptions(apply_best=False), start=Setting(1))
    drive(clock, engine, session, tuner)
    assert tuner.result.best != Setting(1)
    assert engine.setting == Setting(1) == tuner.result.applied


def test_budget_stops_the_tuner_with_what_it_knows():
    truth = Truth()
    clock, engine, session, tuner = make(truth, SPACE, TunerOptions(budget_s=3), start=Setting(2))
    took = drive(clock, engine, session, tuner)
    assert took < 10 and tuner.state == "done"
    assert tuner.result.stop_reason == "budget spent"


def test_no_iterations_fails_with_a_reason():
    truth = Truth()
    clock, engine, session, tuner = make(truth, SPACE, TunerOptions(budget_s=5))
    engine.running = False
    drive(clock, engine, session, tuner)
    assert tuner.state == "failed" and "load" in tuner.status


def test_tuner_refuses_a_server_that_cannot_set_steps():
    from tuner.backends.base import Capabilities

    clock = ManualClock(0)
    engine = SimEngine(Truth(), clock)
    backend = SimBackend(engine)
    backend._caps = Capabilities(HAS_PHASE_STREAM=True, reasons={"speculative_num_steps": "no plugin"})
    with pytest.raises(TuningError, match="no plugin"):
        Tuner(Session(backend, clock=clock), SPACE, feed=SimFeed(engine), runner=InlineRunner())


def test_malformed_records_are_counted_not_fatal():
    truth = Truth()
    clock, engine, session, tuner = make(truth, SPACE, TunerOptions(budget_s=8), start=Setting(2))
    tuner.start()
    engine.records.append({"seq": 0, "steps": "x"})
    for _ in range(40):
        clock.advance(0.25)
        engine.run_until(clock.now())
        session.tick()
        tuner.step()
    assert tuner.bad_records == 1
    assert TuningKind.PROBLEM in kinds(session)


def test_extra_ab_pairs_leave_room_for_the_held_back_probes(monkeypatch):
    """An A/B whose interval keeps spanning 1 takes extra pairs; under a tight budget they must not
    eat the time of the probe held back until after the first verdict (the starting placement's
    second depth), or the table and the SGLang export stay unfitted."""
    import random

    from tests.tuning.sim import SimBackend
    from tuner.core.records import Sample

    rng = random.Random(3)    # a draw whose undecided A/B would take all 4 pairs without the reserve

    def noisy_pump(self):   # client tok/s readings that swing ±70 %: the A/B cannot decide
        e = self.engine
        if self._bus is not None and e.t - self._last_t >= 0.25:
            rate = (e.tokens - self._last_tokens) / (e.t - self._last_t)
            self._bus.put(Sample(e.clock.now(), "server/tok_per_s", rate * rng.choice((0.3, 1.7))))
            self._last_tokens, self._last_t = e.tokens, e.t

    monkeypatch.setattr(SimBackend, "pump", noisy_pump)
    truth = Truth(step=2.0, draft0=1.0, comm_share=0.7)
    space = settings_space(7, placements=("sharded", "replicated"))
    clock, engine, session, tuner = make(truth, space, TunerOptions(budget_s=50), start=Setting(5))
    drive(clock, engine, session, tuner)
    probes = [thaw(e.data) for e in session.store.events(TuningKind.PROBE)]
    assert (7, "sharded") in [(p["setting"]["steps"], p["setting"]["placement"]) for p in probes
                              if p["purpose"] == "probe"]
    assert all(p.tok_s is not None for p in tuner.result.predictions)


@pytest.mark.parametrize("path", ["server throughput", "phase records"])
def test_the_tuners_ab_leaves_out_a_capture_taken_meanwhile(path, monkeypatch):
    """A profiler capture the operator takes while the tuner measures slows the server for seconds:
    its time (with the settling after it) counts on neither side of the tuner's A/B, as on the A/B
    panel's (tuner.core.timeline.excluded), whichever readings the A/B is judged on."""
    from tuner.core.events import EventKind
    from tuner.core.records import Event
    from tuner.tuning import live
    clock, engine, session, tuner = make(Truth(step=0.6), SPACE, start=Setting(1))
    drive(clock, engine, session, tuner)
    if path == "phase records":
        monkeypatch.setattr(session, "throughput_series", lambda: "")
    else:   # judged on the series however few windows the capture leaves it
        monkeypatch.setattr(live.core_windows, "enough", lambda *sides: True)
    cand = [j for j in tuner._done_jobs if j.purpose == "candidate"]
    inc = [j for j in tuner._done_jobs if j.purpose == "incumbent"]
    assert cand and inc
    c0, i0, series0 = tuner._windows(cand, inc)
    # Half a second of capture early in the first candidate measurement: with its catch-up and
    # settling it is over before the incumbent's measurement starts.
    session.put(Event(cand[0].settled_at + 0.75, EventKind.TRACE_CAPTURED, {"trace_id": "t1", "seconds": 0.5}))
    session.tick()
    c1, i1, series1 = tuner._windows(cand, inc)
    assert series1 == series0 and (series0 == "phase/committed_per_s") == (path == "phase records")
    assert len(i1) == len(i0)                        # the incumbent's time had no capture
    assert 0 < len(c1) < len(c0)


def test_an_ab_pair_lost_to_a_capture_is_measured_again_not_given_up():
    """Captures over both candidate segments of the first A/B leave that side no windows: the tuner
    measures another interleaved pair instead of ending with "A/B without data"."""
    from tuner.core.events import EventKind
    from tuner.core.records import Event
    clock, engine, session, tuner = make(Truth(step=0.6), SPACE, start=Setting(1))
    tuner.start()
    covered: list = []
    while tuner.step():
        clock.advance(0.25)
        engine.run_until(clock.now())
        session.tick()
        job = tuner._job
        if len(covered) < 2 and job is not None and job.purpose == "candidate" and job not in covered \
                and math.isfinite(job.end_at):
            # Stated to have run from before the segment settled to its end: all of it is away.
            session.put(Event(job.end_at, EventKind.TRACE_CAPTURED,
                              {"trace_id": f"t{len(covered)}", "seconds": job.end_at - job.settled_at + 1.0}))
            covered.append(job)
    session.tick()
    assert len(covered) == 2
    said = [e.data.get("message", "") for e in session.store.events("tuning_problem")]
    assert not any("too few tok/s windows" in m for m in said), said
    first = session.store.events("tuning_verified")[0].data
    assert first["windows"][0] >= 2 and tuner.result is not None and tuner.result.best != Setting(1)
