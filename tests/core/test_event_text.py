"""One event, one text: the TUI's log, `record`'s progress, `tune`'s output and the report's tuning
table all say an event in tuner.core.event_text's words (they used to keep four copies that
disagreed), and hostile data reads "n/a", never a traceback."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tuner.core.event_text import event_text
from tuner.core.records import Event

S3 = {"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded"}
S5 = {"steps": 5, "topk": 1, "num_draft_tokens": 6, "placement": "replicated"}
TUNING = [
    Event(1.0, "tuning_started", {"initial": S3, "space": [S3, S5], "probes": [S3], "budget_s": 150.0}),
    Event(2.0, "tuning_probe", {"setting": S3, "purpose": "probe", "tok_s": 126.1, "n": 30}),
    Event(3.0, "tuning_prediction", {"bs": 2, "best": {**S5, "tok_s": 247.4, "sd": 25.6}}),
    Event(4.0, "tuning_applied", {"setting": S5, "incumbent": S3, "predicted_tok_s": 265.2, "sd": 13.7,
                                  "predicted_gain": 1.047}),
    Event(5.0, "tuning_verified", {"setting": S5, "verdict": "better", "ratio": 1.819, "lo": 1.441, "hi": 2.148}),
    Event(6.0, "tuning_rolled_back", {"setting": S5, "to": S3, "reason": "worse"}),
    Event(7.0, "tuning_refused", {"setting": S5, "reason": "no"}),
    Event(8.0, "tuning_problem", {"message": "no decode iterations"}),
]


def test_tuning_texts():
    said = [event_text(e.kind, e.data).text for e in TUNING]
    assert said[0] == "tuning from steps 3 topk 1 draft 4 sharded: 2 settings, 1 probes, budget 150 s"
    assert said[1] == "measured steps 3 topk 1 draft 4 sharded (probe): 126.1 tok/s over 30 iterations"
    assert said[2] == "model: best steps 5 topk 1 draft 6 replicated predicted 247.4 ± 25.6 tok/s (bs 2)"
    assert said[3] == ("applying steps 5 topk 1 draft 6 replicated: predicted 265.2 ± 13.7 tok/s "
                       "(+104.7 % vs steps 3 topk 1 draft 4 sharded); verifying with an interleaved A/B")
    assert said[4] == "A/B steps 5 topk 1 draft 6 replicated: better, +81.9 % [+44.1, +114.8]"
    assert said[5] == "rolled back steps 5 topk 1 draft 6 replicated to steps 3 topk 1 draft 4 sharded: worse"


def test_every_reader_says_a_tuning_event_in_the_same_words(monkeypatch):
    from tuner.commands import tune
    from tuner.report.data import RecordingData
    from tuner.report.summary import tuning_of
    from tuner.widgets.views import LOG_HIDDEN, event_line

    printed: list[str] = []
    monkeypatch.setattr(tune, "_say", printed.append)
    for e in TUNING:
        tune.say_event(e)
    data = RecordingData(path=Path("t.db"), header={}, series={}, event_list=TUNING, trace_list=[], problems=[],
                         t_first=0.0, t_last=8.0)
    rows, _ = tuning_of(data)
    words = [event_text(e.kind, e.data).text for e in TUNING]
    assert [p.strip() for p in printed] == words
    assert [r["summary"] for r in rows] == words
    logged = [line.text for e in TUNING if (line := event_line(e, 0.0)) is not None]
    assert logged == [w for e, w in zip(TUNING, words) if e.kind not in LOG_HIDDEN]


def test_record_says_the_connection_events_in_the_logs_words():
    from tuner.commands.record import Progress, say_event
    from tuner.widgets.views import event_line

    events = [Event(1.0, "connected", {"url": "http://h", "after_s": 0}),        # the "recording ..." line says it
              Event(2.0, "disconnected", {"error": "GET http://h/metrics: cannot connect (refused)"}),
              Event(3.0, "connected", {"url": "http://h", "after_s": 12.0}),
              Event(4.0, "degraded", {"reason": "GET http://h/metrics: too slow"}),
              Event(5.0, "connected", {"url": "http://h", "after_s": 0, "was": "degraded"}),
              Event(6.0, "config_changed", {"old": {"speculative_num_steps": 3}, "new": {"speculative_num_steps": 5}})]
    stream = io.StringIO()
    say = say_event(Progress(stream))
    for e in events:
        say(e)
    lines = stream.getvalue().splitlines()
    assert lines == [event_line(e, 0.0).text for e in events[1:]]
    assert lines == ["disconnected: cannot connect (refused)", "connected to http://h after 12s away",
                     "degraded: /metrics: too slow", "answering in time again", "now running steps 3→5"]


@pytest.mark.parametrize("data", [{}, {"setting": "garbage", "ratio": "x", "best": [1]}, {"initial": None, "space": 3},
                                  {"predicted_gain": float("nan"), "sd": None, "tok_s": float("inf")}])
def test_hostile_data_reads_na_never_a_traceback(data):
    for kind in [e.kind for e in TUNING] + ["tuning_finished", "connected", "disconnected", "degraded",
                                            "config_changed", "config_refused", "trace_captured", "note"]:
        said = event_text(kind, data)
        assert said is None or ("\n" not in said.text and said.tone in ("good", "info", "dim", "warn", "error"))
