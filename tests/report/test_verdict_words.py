"""The report's verdict when only one setting has enough settled readings: it says how many windows
each other setting had and what a comparison needs, instead of "only one setting was measured"
(a second setting cut short by captures had run, and the report said it had not)."""

from __future__ import annotations

from tuner.core.windows import MIN_WINDOWS
from tuner.report.rows import SettingRow
from tuner.report.verdict import verdict


def row(label, order, windows, seconds):
    return SettingRow(key=(label,), label=label, order=order, seconds=seconds, windows=list(windows),
                      tok_s=sorted(windows)[len(windows) // 2] if windows else float("nan"))


def test_a_setting_cut_short_is_named_with_its_windows_and_the_need():
    rows = [row("steps 3 sharded", 0, [100.0] * 20, 30.0), row("steps 3 rank0", 1, [150.0] * 2, 9.0),
            row("steps 4 rank0", 2, [], 4.0)]
    (sentence,) = verdict(rows).sentences
    assert sentence.startswith("Only steps 3 sharded has enough settled readings (100.0 tok/s, 20 windows)")
    assert "steps 3 rank0 ran 9 s with 2 settled 1-s windows" in sentence
    assert "steps 4 rank0 ran 4 s with 0 settled 1-s windows" in sentence
    assert f"A comparison needs {MIN_WINDOWS} on each side" in sentence
    assert "Only one setting" not in sentence


def test_one_setting_alone_says_so():
    (sentence,) = verdict([row("steps 3 sharded", 0, [100.0] * 20, 30.0)]).sentences
    assert sentence.startswith("Only one setting ran (steps 3 sharded: 100.0 tok/s)")


def test_active_at_end_is_one_sample_knobs_and_epoch_together():
    from tuner.core.records import Event
    from tuner.report.html import active_at_end

    start = {"speculative_num_steps": 3, "speculative_draft_placement": "sharded", "config_epoch": 1,
             "speculative_algorithm": "EAGLE3"}
    new = {"speculative_num_steps": 4, "speculative_draft_placement": "rank0"}
    events = [Event(0.0, "server_info", {"active": start}),
              Event(5.0, "config_changed", {"old": start, "new": new, "epoch": 3})]
    end = active_at_end(events)
    assert end == {**new, "config_epoch": 3, "speculative_algorithm": "EAGLE3"}
    # A read-back after it is whole, and wins.
    back = {**start, **new, "config_epoch": 3}
    assert active_at_end([*events, Event(6.0, "config_active", {"active": back})]) == back
