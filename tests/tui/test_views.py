"""The panels' arithmetic and words over a real Store: phase parts, bars, change labels, log lines."""

from __future__ import annotations

import math

import pytest

from tuner.core import series as S
from tuner.core.event_text import short_error
from tuner.core.records import Event, Sample
from tuner.core.store import Store
from tuner.widgets import views
from tuner.widgets.fmt import hbar, rel_time, sparkline
from tuner.widgets.phases import PhaseSplit, PhaseView, segment_ms, stacked_bar, untimed_comm


def test_phase_parts_never_stack_a_phase_on_its_comm_part():
    view = PhaseView(phase_ms={"draft": 3.0, "verify": 5.0, "verify_sample": 0.5, "draft_extend": 1.0, "other": 0.5},
                     comm_ms={"draft": 1.0, "verify": 2.0, "draft_extend": 0.25}, wall_ms=12.0, iterations=10)
    parts = segment_ms(view)
    # Disjoint parts: compute + comm of each phase equals the phase's inclusive time, and the whole
    # bar is the wall time (10 ms of phases + 2 ms idle), not wall + comm.
    assert parts["draft"] + parts["draft_comm"] == pytest.approx(3.0)
    assert parts["verify"] + parts["verify_comm"] == pytest.approx(5.0)
    assert parts["draft_extend"] + parts["draft_extend_comm"] == pytest.approx(1.0)
    assert parts["idle"] == pytest.approx(0.5 + 2.0)
    assert sum(parts.values()) == pytest.approx(12.0)


def test_phase_parts_with_nan_comm_and_no_wall():
    view = PhaseView(phase_ms={"draft": 2.0, "verify": math.nan}, comm_ms={"draft": math.nan}, iterations=1)
    parts = segment_ms(view)
    assert parts["draft"] == 2.0 and parts["draft_comm"] == 0.0 and parts["verify"] == 0.0
    assert sum(parts.values()) == pytest.approx(2.0)


def test_collectives_inside_cuda_graphs_read_as_untimed_not_zero():
    """A TP server with graphs: the verify and draft phases ran collectives inside graphs (no comm
    time), the replicated extend ran none (comm 0). Only the graph phases say "in graph"."""
    from rich.console import Console

    view = PhaseView(phase_ms={"draft": 1.1, "verify": 6.2, "verify_sample": 2.0, "draft_extend": 0.9, "other": 1.0},
                     comm_ms={"draft": math.nan, "verify": math.nan, "draft_extend": 0.0}, wall_ms=12.0, iterations=40)
    assert untimed_comm(view) == ("draft", "verify")
    w = PhaseSplit()
    w.show(view)
    console = Console(width=60, record=True, color_system=None)
    console.print(w.render())
    text = console.export_text()
    def line(label: str) -> str:
        return next(ln for ln in text.splitlines() if label in ln)
    assert "in graph" in line("draft collectives") and "in graph" in line("verify collectives")
    assert "0.00" in line("extend collectives")
    assert "inside CUDA graphs" in text and "collectives 0.0%" not in text
    # Measured comm everywhere: the share is printed as before.
    timed = PhaseView(phase_ms=view.phase_ms, comm_ms={"draft": 0.5, "verify": 1.0, "draft_extend": 0.0},
                      wall_ms=12.0, iterations=40)
    w.show(timed)
    console.print(w.render())
    assert "collectives 12.5%" in console.export_text()


@pytest.mark.parametrize("width", [1, 7, 40, 113])
def test_stacked_bar_fills_exactly_its_width(width):
    parts = {"draft": 1.0, "draft_comm": 0.3, "verify": 2.2, "verify_comm": 0.1, "verify_sample": 0.05,
             "draft_extend": 0.4, "draft_extend_comm": 0.2, "idle": 0.7}
    assert stacked_bar(parts, width).cell_len == width


def test_text_helpers():
    assert hbar(0.5, 4) == "██  "
    assert hbar(math.nan, 3) == "   "
    assert rel_time(65.25) == "+1:05.2"
    assert rel_time(3725.0).startswith("+1:02:05")
    assert sparkline([0, 50, 100, math.nan], 4, top=100) == "▁▄█ "


def _store(records) -> Store:
    st = Store()
    st.add_many(records)
    return st


def test_phase_view_is_the_mean_over_the_window():
    recs = []
    for i, ms in enumerate([2.0, 4.0, 6.0]):
        recs += [Sample(100.0 + i, S.phase_ms("draft"), ms), Sample(100.0 + i, S.phase_comm_ms("draft"), 1.0),
                 Sample(100.0 + i, S.PHASE_WALL_MS, 10.0), Sample(100.0 + i, S.SERVER_ITERATIONS, 10.0 * i)]
    view = views.phase_view(_store(recs), t_end=102.0, window_s=10.0)
    assert view.phase_ms["draft"] == pytest.approx(4.0)
    assert view.comm_ms["draft"] == pytest.approx(1.0)
    assert view.iterations == 20
    assert math.isnan(view.phase_ms["verify"])


def test_throughput_view_is_relative_to_the_origin_and_marks_changes():
    recs = [Sample(1000.0 + i, S.SERVER_TOK_PER_S, 50.0 + i) for i in range(10)]
    recs.append(Event(1004.5, "config_changed", {"old": {"speculative_num_steps": 3},
                                                 "new": {"speculative_num_steps": 5}}))
    chart = views.throughput_view(_store(recs), origin=1000.0, t_end=1009.0, window_s=60.0)
    assert chart.series[0].t[0] == 0.0 and chart.series[0].t[-1] == 9.0
    assert chart.markers == ((4.5, "steps 3→5"),)


def test_accept_view_reads_positions_up_to_steps():
    recs = [Sample(5.0, S.SPEC_ACCEPT_LEN, 2.5)] + [Sample(5.0, S.accept_pos(k), p)
                                                     for k, p in enumerate([0.8, 0.5, 0.2, 0.1], 1)]
    st = _store(recs)
    assert views.accept_view(st, 5.0, steps=3).positions == (0.8, 0.5, 0.2)
    assert views.accept_view(st, 5.0, steps=None).positions == (0.8, 0.5, 0.2, 0.1)
    assert views.accept_view(st, 5.0, steps=3).accept_len == 2.5
    assert views.accept_view(st, 5.0, steps=3).buckets == ()      # a recording from before the buckets


def test_accept_view_pools_bucket_counts_over_the_window():
    # Two pages of the bs8 bucket: 4 rounds (p = 3/4, 1/4) then 6 rounds (p = 1/2, 0): pooled, not averaged.
    recs = [Sample(4.0, S.bucket_verifies("bs8"), 4.0), Sample(4.0, S.bucket_accept_pos("bs8", 1), 0.75),
            Sample(4.0, S.bucket_accept_pos("bs8", 2), 0.25),
            Sample(5.0, S.bucket_verifies("bs8"), 6.0), Sample(5.0, S.bucket_accept_pos("bs8", 1), 0.5),
            Sample(5.0, S.bucket_accept_pos("bs8", 2), 0.0),
            Sample(5.0, S.bucket_verifies("ctx256"), 2.0), Sample(5.0, S.bucket_accept_pos("ctx256", 1), 1.0),
            Sample(5.0, S.bucket_accept_pos("ctx256", 2), 0.5)]
    [(r1, n1, p1), (r2, n2, p2)] = views.accept_view(_store(recs), 5.0, steps=2).buckets
    assert (r1, n1) == ("batch 8–15", 10) and p1 == pytest.approx((0.6, 0.1))
    assert (r2, n2, p2) == ("context 256–511", 2, (1.0, 0.5))


def test_gpu_view_finds_every_gpu_and_converts_units():
    recs = []
    for g in range(8):
        recs += [Sample(1.0, S.gpu(g, "sm_active_pct"), 10.0 * g if g else math.nan),
                 Sample(1.0, S.gpu(g, "util_pct"), 99.0),
                 Sample(1.0, S.gpu(g, "mem_used_mib"), 1024.0), Sample(1.0, S.gpu(g, "pcie_rx_mbps"), 2.0)]
    view = views.gpu_view(_store(recs), t_end=1.0)
    assert [r.index for r in view.rows] == list(range(8))
    assert view.rows[3].sm_pct == 30.0
    assert view.rows[0].sm_pct == 99.0, "no GPM reading: utilisation stands in"
    assert view.rows[0].mem_used == 1024.0 * 2**20
    assert view.rows[0].pcie_rx == 2e6
    assert math.isnan(view.rows[0].power_w)


@pytest.mark.parametrize("kind,data,needle,level", [
    ("config_refused", {"changes": {"speculative_eagle_topk": 9}, "reason": "topk too big"}, "topk=9: topk too big", "error"),
    ("disconnected", {"error": "connection refused"}, "disconnected: connection refused", "error"),
    ("connected", {"url": "http://x", "after_s": 12.0}, "after 12s away", "good"),
    ("config_changed", {"old": {"speculative_draft_placement": "sharded"},
                        "new": {"speculative_draft_placement": "rank0"}}, "placement sharded→rank0", "good"),
])
def test_event_lines(kind, data, needle, level):
    line = views.event_line(Event(10.0, kind, data), origin=4.0)
    assert line is not None and needle in line.text and line.level == level and line.t == 6.0


def test_unknown_event_kinds_are_not_logged():
    assert views.event_line(Event(1.0, "someone_elses_kind", {}), 0.0) is None


def test_setting_text():
    assert views.setting_text({"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                               "speculative_num_draft_tokens": 4, "speculative_draft_placement": "rank0"}) \
        == "steps 3 · topk 1 · draft 4 · rank0"
    assert views.setting_text({"speculative_num_steps": 0}).startswith("tier 0 (draft kept warm)")


def test_knob_markup_parses_with_every_control_and_hides_them_read_only():
    from tuner.widgets.knobs import KnobsPanel, KnobView

    view = KnobView({"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                     "speculative_draft_placement": "sharded"}, load="off",
                    refused="draft=5: [not] markup", pending="steps 3 → 4")
    text = KnobsPanel.markup(view).plain
    assert " - " in text and " + " in text and " p " in text and "[not] markup" in text
    read_only = KnobsPanel.markup(KnobView({"speculative_num_steps": 3, "speculative_draft_placement": "rank0"},
                                           read_only=True)).plain
    assert " + " not in read_only and "rank0" in read_only


def test_trailing_mean_skips_gaps_and_forgets_old_values():
    t = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
    v = (10.0, math.nan, 20.0, 30.0, math.nan, math.nan)
    out = views.trailing_mean(t, v, span=1.0)
    assert out[:4] == (10.0, 10.0, 20.0, 25.0)
    assert out[4] == 30.0 and math.isnan(out[5])


def test_short_error_drops_the_request_and_fits_the_header():
    assert short_error("GET http://127.0.0.1:1/specdecode/phases: cannot connect (refused)") == \
        "cannot connect (refused)"
    assert len(short_error("x" * 200)) == 60


def _record(seq: int, prefill: float | None) -> dict:
    phase = {"draft": 2.0, "verify": 4.0, "verify_sample": 0.5, "draft_extend": 1.0, "other": 0.5}
    comm = {"draft": 0.5, "verify": 1.0, "verify_sample": 0.0, "draft_extend": 0.2, "other": 0.0}
    if prefill is not None:
        phase["prefill"], comm["prefill"] = prefill, prefill / 4
    return {"seq": seq, "t": 50.0 + seq / 100, "epoch": 1, "steps": 3, "topk": 1, "num_draft_tokens": 4,
            "placement": "sharded", "bs": 2, "committed": 6, "wall_ms": sum(phase.values()),
            "phase_ms": phase, "comm_ms": comm, "accepted": [2, 2]}


@pytest.mark.parametrize("prefills, shown", [([0.0, 3.0, 0.0, 1.0], "1.00"),   # a record after each admission
                                             ([None] * 4, "0.00")])             # an older server or recording
def test_prefill_is_its_own_segment_of_the_phase_panel(prefills, shown):
    from rich.console import Console

    from tuner.backends.derive import PhaseStreamReader
    reader = PhaseStreamReader()
    reader.update(100.0, {"records": [_record(1, 0.0)], "next": 1})       # attaching: history only
    samples, _ = reader.update(101.0, {"records": [_record(2 + i, p) for i, p in enumerate(prefills)], "next": 5})
    view = views.phase_view(_store(samples), t_end=101.0, window_s=10.0)
    parts = segment_ms(view)
    assert parts["prefill"] == pytest.approx(float(shown))
    # The bar is the wall: prefill is not counted again in idle, nor its collectives split out.
    assert sum(parts.values()) == pytest.approx(view.wall_ms)
    assert parts["idle"] == pytest.approx(0.5)
    w = PhaseSplit()
    w.show(view)
    console = Console(width=60, record=True, color_system=None)
    console.print(w.render())
    row = next(ln for ln in console.export_text().splitlines() if "prefill" in ln)
    assert shown in row
