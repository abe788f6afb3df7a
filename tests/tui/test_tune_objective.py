"""The TUI's tune key under an objective: attach's --tune-objective/--tune-slo reach the tuner the
key starts, and the tune screen says what it judges and, in each setting's row, its predicted and
measured latency and whether it meets the SLO."""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest

from tuner.app import make_app
from tuner.commands.options import OpenError, add_load_arguments, add_tui_tune_arguments, tui_inputs
from textual.widgets import DataTable

from tuner.core.session import Session
from tuner.screens.tune import TuneScreen
from tuner.tuning.slo import Objective, parse_slo
from tuner.widgets.tune_view import build_view

STEPS3 = {"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded"}
STEPS1 = {"steps": 1, "topk": 1, "num_draft_tokens": 2, "placement": "sharded"}
STEPS5 = {"steps": 5, "topk": 1, "num_draft_tokens": 6, "placement": "sharded"}


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


OBJ = {**Objective("throughput", parse_slo("itl_p99<=40ms")).to_json(), "itl": "itl_p99", "met": True,
       "settings": [
           {**STEPS3, "tok_s": 120.0, "figures": {"itl_p99": 0.050}, "meets": False,
            "predicted_itl": 0.048, "predicted_itl_sd": 0.004},
           {**STEPS1, "tok_s": 90.0, "figures": {"itl_p99": 0.030}, "meets": True,
            "predicted_itl": 0.031, "predicted_itl_sd": 0.002}],
       "predicted": [{**STEPS5, "predicted_itl": 0.061, "predicted_itl_sd": 0.006}]}
PREDICTIONS = [{**s, "tok_s": t, "sd": 2.0, "basis": "fitted"} for s, t in ((STEPS3, 121.0), (STEPS1, 92.0),
                                                                               (STEPS5, 118.0))]


def test_the_view_says_the_objective_and_each_settings_latency_in_its_row():
    running = build_view({"objective_text": "tok/s subject to itl_p99<=40ms"}, state="running")
    assert running.objective == ("objective: tok/s subject to itl_p99<=40ms",)
    done = build_view({"objective": OBJ, "best": STEPS1, "predictions": PREDICTIONS}, state="done")
    assert done.objective == ("objective: throughput, SLO itl_p99<=40ms (judged: itl_p99)",)
    rows = {r.setting["steps"]: r for r in done.rows}
    assert (rows[3].itl, rows[3].itl_sd, rows[3].itl_measured, rows[3].meets) == (0.048, 0.004, 0.050, False)
    assert (rows[1].itl_measured, rows[1].meets) == (0.030, True)
    # Predicted, never measured: its predicted ITL, no verdict.
    assert rows[5].itl == 0.061 and math.isnan(rows[5].itl_measured) and rows[5].meets is None
    assert build_view({}, state="idle").objective == ()


def test_the_tune_key_s_table_under_an_slo_has_latency_columns_that_fit_120():
    async def scenario():
        app = make_app(Session(), tick_s=None)
        async with app.run_test(size=(120, 30)) as pilot:
            app.push_screen(TuneScreen(recorded=({"objective": OBJ, "best": STEPS1, "predictions": PREDICTIONS,
                                                  "measured_tok_s": []}, "done")))
            await pilot.pause()
            table = app.screen.query_one("#tune-table", DataTable)
            labels = [str(c.label) for c in table.ordered_columns]
            assert labels[5:8] == ["ITL pred.", "ITL meas.", "SLO"]
            cells = {str(table.get_row_at(i)[1]): [str(c) for c in table.get_row_at(i)]
                     for i in range(table.row_count)}
            assert cells["s3 k1 N4 sharded"][5:8] == ["48.0 ± 4.0", "50.0", "misses"]
            assert cells["s1 k1 N2 sharded"][5:8] == ["31.0 ± 2.0", "30.0", "meets"]
            assert cells["s5 k1 N6 sharded"][5:8] == ["61.0 ± 6.0", "—", ""]
            # All of it on a 120-column terminal, with room for the vertical scrollbar: no sideways scroll.
            assert table.virtual_size.width <= 120 - 2
            # Plain throughput (a recording without an objective): the table as before.
            app.pop_screen()
            app.push_screen(TuneScreen(recorded=({"best": STEPS1, "predictions": PREDICTIONS}, "done")))
            await pilot.pause()
            plain = app.screen.query_one("#tune-table", DataTable)
            assert "SLO" not in [str(c.label) for c in plain.ordered_columns]
    asyncio.run(scenario())


def test_the_running_tuners_rows_carry_latency_before_it_finishes():
    """While an SLO tuning runs, the screen's doc has each measured setting's measured ITL and
    verdict and every prediction's ITL (not only once finished); the report is not recomputed
    between measurements."""
    from tests.tuning.sim import make
    from tests.tuning.synth import Truth
    from tuner.tuning.live import TunerOptions
    from tuner.tuning.settings import Setting, settings_space
    from tuner.widgets.tune_view import live_doc

    clock, engine, session, tuner = make(Truth(step=0.6), settings_space(3), TunerOptions(
        budget_s=300, objective=Objective(slo=parse_slo("itl_p99<=40ms"))), start=Setting(3))
    tuner.start()
    seen = None
    while tuner.step():
        clock.advance(0.25)
        engine.run_until(clock.now())
        session.tick()
        if tuner.result is None and seen is None:
            view = build_view(live_doc(tuner, None), state="running")
            measured = [r for r in view.rows if not math.isnan(r.itl_measured)]
            if measured and any(not math.isnan(r.itl) for r in view.rows):
                seen = view
                assert tuner.objective_report() is tuner.objective_report()   # no new records: memo
                assert all(r.meets == (r.itl_measured <= 0.040) for r in measured)
    assert seen is not None
