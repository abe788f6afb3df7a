"""The tuning's outcome in one line (tuner.tuning.summary.result_line): the verified gain over the
starting setting first, then why it stopped in the words of the candidate it did not try. A user
read "predicted gain -3.9 %" after a +74 % verified result as the tuning's own figure."""

from __future__ import annotations

import pytest

from tuner.core.event_text import event_text
from tuner.tuning.summary import result_line, stop_words, summary

START = {"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded"}
RANK0 = {**START, "placement": "rank0"}
DEEP = {**RANK0, "steps": 5, "num_draft_tokens": 6}


def ab(setting, incumbent, ratio, verdict="better"):
    return {"setting": setting, "incumbent": incumbent, "verdict": verdict, "ratio": ratio,
            "lo": ratio - 0.1, "hi": ratio + 0.1, "predicted_ratio": 1.2, "windows": [6, 6],
            "series": "load/tok_per_s"}


def result(best, verifications, reason="next candidate predicted -3.9 %, within noise"):
    return {"best": best, "initial": START, "applied": best, "stop_reason": reason,
            "verifications": verifications, "elapsed_s": 120.0, "probes": 6, "bs": 4,
            "predictions": [], "measured_tok_s": []}


def test_one_verified_win_reads_as_the_gain_over_the_start():
    line = result_line(result(RANK0, [ab(RANK0, START, 1.74)]))
    assert line == ("best steps 3 topk 1 draft 4 rank0: +74 % vs start (A/B) · "
                    "stopped: next candidate predicted -3.9 %, within noise")
    assert summary(result(RANK0, [ab(RANK0, START, 1.74)]))[0] == line


def test_a_chain_of_wins_multiplies_and_says_so():
    r = result(DEEP, [ab(RANK0, START, 1.5), ab(DEEP, RANK0, 1.2), ab(START, RANK0, 0.8, "worse")])
    assert "+80 % vs start (2 A/Bs chained)" in result_line(r)


def test_the_start_kept_and_an_unverified_best_say_so():
    assert "the starting setting (nothing verified better)" in result_line(result(START, []))
    assert "not verified against the start" in result_line(result(RANK0, []))


@pytest.mark.parametrize("old, new", [
    ("predicted gain -14.7 % is within noise", "next candidate predicted -14.7 %, within noise"),
    ("measured gain +1.2 % is within noise [-3.0, +5.1]", "next candidate measured +1.2 % [-3.0, +5.1], within noise"),
    ("budget spent", "budget spent"),
])
def test_recorded_stop_reasons_are_worded_as_the_next_candidate(old, new):
    assert stop_words(old) == new


def test_the_event_log_words_it_the_same_way():
    r = result(RANK0, [ab(RANK0, START, 1.46)], "predicted gain -14.7 % is within noise")
    said = event_text("tuning_finished", r)
    assert said is not None and said.text == "tuning done: " + result_line(r)
    assert "predicted gain" not in said.text
