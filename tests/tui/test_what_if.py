"""The what-if readout (tuner.tuning.what_if_now) over a real Store, and the tune screen's view of a
recorded tuning (tuner.widgets.tune_view) over the committed `tune --out` recording."""

from __future__ import annotations

import math

import pytest

from tuner.commands.replay import open_replay
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.store import Store
from tuner.tuning.what_if_now import active_setting, what_if_now
from tuner.tuning.summary import label
from tuner.widgets.tune_view import TUNING_KINDS, build_view, recorded_doc
from tuner.widgets.what_if import what_if_text

from .scenarios import TUNING_FIXTURE

ACTIVE = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
          "speculative_draft_placement": "sharded"}
PHASES = {"draft": (10.0, 6.0), "draft_extend": (4.0, 2.0), "verify": (20.0, 5.0), "verify_sample": (1.0, 0.0)}


def feed(store: Store, t0: float, t1: float, scale: float = 1.0, hz: int = 4) -> None:
    out = []
    for i in range(int((t1 - t0) * hz)):
        t = t0 + i / hz
        for p, (ms, comm) in PHASES.items():
            out += [Sample(t, S.phase_ms(p), ms * scale), Sample(t, S.phase_comm_ms(p), comm * scale)]
        out += [Sample(t, S.PHASE_WALL_MS, 37.0 * scale), Sample(t, S.SERVER_BATCH, 1.0),
                Sample(t, S.SPEC_VERIFIES, 10.0)]
        out += [Sample(t, S.accept_pos(k), p) for k, p in ((1, 0.8), (2, 0.6), (3, 0.4))]
    store.add_many(out)


def test_what_if_is_the_cost_models_formula_on_the_settled_readings():
    st = Store()
    feed(st, 0.0, 10.0, scale=3.0)          # another setting, before the change: not used
    st.add_many([Event(10.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": ACTIVE, "epoch": 2})])
    feed(st, 10.0, 20.0)
    w = what_if_now(st, 20.0, ACTIVE, tp_size=2)
    assert w.available, w.reason
    tau = 1 + 0.8 + 0.6 + 0.4
    # T = 37 ms now; off the group the draft's 8 ms of collectives go: 29 ms; low: its 6 ms of
    # compute doubled (the whole layer on one rank): 35 ms.
    assert w.tok_s_now == pytest.approx(1000 * tau / 37.0, rel=1e-3)
    assert w.tok_s == pytest.approx(1000 * tau / 29.0, rel=1e-3)
    assert w.tok_s_low == pytest.approx(1000 * tau / 35.0, rel=1e-3)
    assert w.comm_share == pytest.approx(8 / 14)
    lo, hi = w.gain()
    assert lo == pytest.approx(37 / 35) and hi == pytest.approx(37 / 29)
    # One prediction per placement: rank0 runs the draft on rank 0 alone; replicated has the same
    # critical path where each rank has its own device, and says what it costs.
    rank0, replicated = w.placements
    assert (rank0.placement, replicated.placement) == ("rank0", "replicated")
    assert (rank0.tok_s_low, rank0.tok_s) == (w.tok_s_low, w.tok_s)
    assert "whole draft's compute on every rank" in replicated.note
    text = what_if_text(w).plain
    assert "vs model 75.7 tok/s now · collectives 57% of the draft" in text
    assert "rank0      +6%…+28%  80.0–96.6 tok/s" in text
    assert "replicated +6%…+28%: pays the whole draft's compute on every rank" in text


def test_on_cpu_replicated_is_not_predicted_and_says_why():
    # On CPU the ranks share the host's cores: replicated runs the whole draft on every rank, so
    # the ranks compete for the cores (the demo's 2-core machine read -19 % there, rank0 +47 %).
    st = Store()
    feed(st, 0.0, 10.0)
    w = what_if_now(st, 10.0, ACTIVE, tp_size=2, device="cpu")
    rank0, replicated = w.placements
    assert rank0.tok_s == w.tok_s and math.isnan(replicated.tok_s)
    text = what_if_text(w).plain
    assert "replicated n/a: pays the whole draft's compute on every rank, on shared CPU cores" in text
    assert "rank0      +6%…+28%" in text


@pytest.mark.parametrize("active,tp,has_phases,why", [
    ({**ACTIVE, "speculative_draft_placement": "rank0"}, 2, True, "already runs off the TP group (rank0)"),
    ({**ACTIVE, "speculative_num_steps": 0}, 2, True, "tier 0 (draft kept warm)"),
    (ACTIVE, 1, True, "TP size 1"),
    (ACTIVE, 2, False, "no phase stream"),
    ({}, 2, True, "has not reported its setting"),
])
def test_what_if_says_why_not(active, tp, has_phases, why):
    st = Store()
    feed(st, 0.0, 10.0)
    w = what_if_now(st, 10.0, active, tp, has_phases=has_phases)
    assert not w.available and why in w.reason
    assert what_if_text(w).plain.startswith("draft off the TP group  n/a\n")


def test_what_if_does_not_guess_collectives_it_cannot_see():
    """A GPU server with CUDA graphs: the draft's collectives have no time (NaN), not 0 ms."""
    st = Store()
    feed(st, 0.0, 10.0)
    st.add_many([Sample(t / 4, S.phase_comm_ms("draft"), math.nan) for t in range(40)])
    st2 = Store()
    out = []
    for i in range(40):
        t = i / 4
        out += [Sample(t, S.phase_ms(p), ms) for p, (ms, _) in PHASES.items()]
        out += [Sample(t, S.phase_comm_ms("draft"), math.nan), Sample(t, S.PHASE_WALL_MS, 37.0),
                Sample(t, S.SERVER_BATCH, 1.0), Sample(t, S.SPEC_VERIFIES, 10.0)]
        out += [Sample(t, S.accept_pos(k), p) for k, p in ((1, 0.8), (2, 0.6), (3, 0.4))]
    st2.add_many(out)
    w = what_if_now(st2, 10.0, ACTIVE, 2)
    assert not w.available and "inside CUDA graphs" in w.reason
    # On SGLang placement is no setting: the line points at what is (p would be refused there)
    sg = what_if_now(st2, 10.0, ACTIVE, 2, kind="sglang")
    assert "cannot move the draft off the TP group" in sg.reason and "PCIe-IPC" in sg.reason
    assert "p tries it" not in sg.reason
    assert what_if_now(st, 10.0, ACTIVE, 2).available, "timed readings in the window still count"


def test_what_if_waits_for_settled_readings_of_the_active_setting():
    st = Store()
    feed(st, 0.0, 10.0)
    st.add_many([Event(10.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": ACTIVE, "epoch": 2})])
    feed(st, 10.0, 11.5)
    assert "waiting for settled" in what_if_now(st, 11.5, ACTIVE, 2).reason
    assert "waiting" in what_if_now(Store(), 5.0, ACTIVE, 2).reason


def test_active_setting_of_a_read_back():
    assert active_setting(ACTIVE).label() == "s3 k1 N4 sharded"
    assert active_setting({"speculative_num_steps": 0}).steps == 0
    assert active_setting({"speculative_num_steps": 2, "speculative_num_draft_tokens": 7}) is None
    assert active_setting({}) is None


def test_recorded_tuning_view_of_a_real_tune_recording():
    session = open_replay(TUNING_FIXTURE, start=0.0, paused=True)
    try:
        session.start()
        backend = session.backend
        session.seek(backend.start_t + backend.length_s)
        session.tick()
        doc, state = recorded_doc(session.store.events(TUNING_KINDS))
    finally:
        session.close()
    assert state == "done"
    view = build_view(doc, state=state, read_only=True)
    best = [r for r in view.rows if "★" in r.marks]
    assert len(best) == 1 and best[0].setting == doc["best"]
    assert view.rows[0].predicted == max(r.predicted for r in view.rows if not math.isnan(r.predicted))
    assert all(r.predicted > 0 and r.sd > 0 for r in view.rows if not math.isnan(r.predicted))
    assert sum(not math.isnan(r.measured) for r in view.rows) >= 4
    assert len(view.verifications) == len(doc["verifications"]) >= 1
    assert any(line.startswith("sharded (bs ") for line in view.costs)
    assert view.result.startswith("best ") and "vs start (A/B) · stopped: next candidate predicted" in view.result
    assert view.result.endswith(f"the server runs {label(doc['applied'])}")
    # After enter applied another row, the header names what the server runs now, not the result's.
    other = {**doc["initial"]}
    assert build_view(doc, state=state, current=other).result.endswith(f"the server runs {label(other)}")


def test_a_tuning_cut_short_is_rebuilt_from_its_events():
    pred = {"steps": 2, "topk": 1, "num_draft_tokens": 3, "placement": "sharded", "tok_s": 50.0, "sd": 2.0,
            "tau": 2.5, "basis": "fitted", "reason": ""}
    events = [Event(1.0, "tuning_started", {"initial": {}, "space": [], "probes": [], "budget_s": 60}),
              Event(2.0, "tuning_probe", {"setting": {k: pred[k] for k in ("steps", "topk", "num_draft_tokens",
                                                                           "placement")}, "tok_s": 48.0}),
              Event(3.0, "tuning_prediction", {"bs": 1, "best": pred, "predictions": [pred], "model": None})]
    doc, state = recorded_doc(events)
    assert state == "cut short"
    (row,) = build_view(doc, state=state).rows
    assert row.predicted == 50.0 and row.measured == 48.0 and row.marks == "★"
    assert recorded_doc([Event(1.0, "note", {"text": "x"})]) is None


def test_the_event_log_shows_the_tuners_decisions():
    session = open_replay(TUNING_FIXTURE, start=0.0, paused=True)
    try:
        session.start()
        session.seek(session.backend.start_t + session.backend.length_s)
        session.tick()
        from tuner.widgets import views
        lines = [line.text for e in session.store.events()
                 if (line := views.event_line(e, session.backend.start_t)) is not None]
    finally:
        session.close()
    assert any(x.startswith("tuning from ") for x in lines)
    assert any(x.startswith("applying ") and "predicted" in x for x in lines)
    assert any(x.startswith("A/B ") for x in lines)
    assert any(x.startswith("tuning done: best ") for x in lines)
    assert not any("measured" in x for x in lines)      # probes stay in the tune screen


def test_u_on_a_replay_shows_the_recorded_tuning_only_when_there_is_one():
    import asyncio

    from tuner.screens.tune import TuneScreen

    from .scenarios import Scenario, replay_app

    async def scenario():
        app = replay_app(Scenario("plain", 20.0))
        async with app.run_test(size=(120, 40)) as pilot:
            # The key works on every replay: without a recorded tuning it says so (it did nothing).
            assert "tune" in [a for _, a, _ in app.key_help()]
            await pilot.press("u")
            await pilot.pause()
            assert not isinstance(app.screen, TuneScreen)
            assert any("no tuning in this recording" in n.message for n in app._notifications)
        app = replay_app(Scenario("tuned", 43.2, fixture=TUNING_FIXTURE))
        async with app.run_test(size=(120, 40)) as pilot:
            assert ("u", "tune", "tune") in app.key_help()
            await pilot.press("u")
            screen = app.screen
            assert isinstance(screen, TuneScreen) and screen.tuner is None
            assert screen.check_action("apply", ()) is False and screen.check_action("stop", ()) is False
            assert screen.view.state == "done" and screen.view.read_only
            await pilot.press("escape")
            assert not isinstance(app.screen, TuneScreen)
    asyncio.run(scenario())


def test_a_rows_measured_figure_is_at_the_predictions_batch_size():
    """A probe on a server whose batch came and went ran at bs 1 and 2; the prediction is for bs 2.
    The row shows what was measured at bs 2, the quantity the model predicts; the probe's mixed
    figure only where nothing was measured at that batch size. The CLI's table reads the same."""
    from tuner.tuning.summary import table

    def pred(steps, tok_s, measured):
        return {"steps": steps, "topk": 1, "num_draft_tokens": steps + 1, "placement": "sharded", "bs": 2,
                "tok_s": tok_s, "sd": 2.0, "tau": 1.0 + steps / 2, "basis": "fitted", "reason": "",
                "measured_tok_s": measured}
    doc = {"predictions": [pred(1, 22.7, 22.1), pred(2, 30.0, None)], "verifications": [], "model": None,
           "measured_tok_s": [{"steps": 1, "topk": 1, "num_draft_tokens": 2, "placement": "sharded", "tok_s": 9.8},
                              {"steps": 2, "topk": 1, "num_draft_tokens": 3, "placement": "sharded", "tok_s": 27.5}]}
    rows = {r.label: r for r in build_view(doc, state="done").rows}
    assert rows["s1 k1 N2 sharded"].measured == 22.1         # not the probe's mixed-batch 9.8
    assert rows["s2 k1 N3 sharded"].measured == 27.5         # nothing at bs 2: the probe's figure
    lines = table(doc)
    assert any("steps 1 " in line and " 22.1 " in line for line in lines), lines
    assert any("steps 2 " in line and " 27.5 " in line for line in lines), lines
