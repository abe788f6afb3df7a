"""The trace analysis screen states every figure in its table's unit: the analysis sums the skew
across ranks over the aligned iterations, and the table, headed "ms per iteration", divides it."""

from __future__ import annotations

from rich.console import Console

from tuner.screens.trace import analysis_table, summary

ANALYSIS = {
    "mode": "cpu", "phases": ["draft", "verify"],
    "ranks": [{"rank": r, "iterations": [{}] * 10,
               "mean": {"phases": {"draft": {"ms": 4.0 + r, "comm_ms": 1.0}, "verify": {"ms": 9.0, "comm_ms": 2.0}},
                        "wall_ms": 15.0, "busy_ms": 13.0, "comm_ms": 3.0, "idle_ms": 2.0}} for r in (0, 1)],
    "across": {"aligned_iterations": 10, "slowest_rank": 1, "skew_ms": 12.5,
               "phases": {"draft": {"skew_ms": 10.0, "slowest_rank": 1}, "verify": {"skew_ms": 2.5, "slowest_rank": 0}}},
}


def text_of(renderable) -> str:
    console = Console(width=160, record=True)
    console.print(renderable)
    return console.export_text()


def test_skew_is_per_iteration_like_the_rest_of_the_table():
    table = text_of(analysis_table(ANALYSIS))
    draft = next(line for line in table.splitlines() if line.strip().startswith("draft"))
    assert draft.split()[-2:] == ["1.00", "1"], draft          # 10 ms over 10 iterations
    assert "10.00" not in draft
    head = summary(ANALYSIS).plain
    assert "skew 1.25 ms per iteration (12.50 ms over 10)" in head
