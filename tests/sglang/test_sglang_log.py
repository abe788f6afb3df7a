"""SGLang's decode log line → samples (tuner.backends.sglang.log), on a log written from reference §8."""

from __future__ import annotations

import calendar
import math
import time
from pathlib import Path

import pytest

from tuner.core import series as S
from tuner.backends.sglang.log import (LogLineError, LogTail, log_samples, parse_line, parse_lines, parse_tier_line,
                                      read_log, to_samples)

LOG = Path(__file__).parent / "fixtures" / "server_tp8_adaptive.log"
UTC = 0.0


def test_the_reference_example_line():
    d = parse_line("[2026-01-01 12:00:00 TP0] Decode batch, #running-req: 1, #token: 1234, "
                   "token usage: 0.01, accept len: 2.95, accept rate: 0.49, cuda graph: True, "
                   "gen throughput (token/s): 94.12, #queue-req: 0", utc_offset_s=UTC)
    assert d.t == calendar.timegm((2026, 1, 1, 12, 0, 0, 0, 0, 0))
    assert d.ranks == {"TP": 0} and d.running_reqs == 1 and d.tokens == 1234
    assert (d.token_usage, d.accept_len, d.accept_rate) == (0.01, 2.95, 0.49)
    assert d.graph is True and d.gen_throughput == 94.12 and d.queue_reqs == 0


def test_log_file_gives_only_decode_lines_with_extras_kept():
    lines = read_log(LOG, utc_offset_s=UTC)
    assert [d.gen_throughput for d in lines] == [94.12, 301.55, 307.10, 305.77]
    assert lines[1].extra == {"fwd occupancy": "0.91"} and lines[1].queue_reqs == 2


def test_prefix_order_milliseconds_iteration_and_other_graph_kinds():
    d = parse_line("[2026-01-01 12:00:00.250 DP1 PP0 TP3 EP3] Decode batch [812], #running-req: 9, "
                   "#full token: 10, full token usage: 0.20, #swa token: 4, swa token usage: 0.10, "
                   "cpu graph: False, gen throughput (token/s): 11.50, #queue-req: 3", utc_offset_s=3600)
    assert d.ranks == {"DP": 1, "PP": 0, "TP": 3, "EP": 3} and d.dp == 1
    assert d.t == calendar.timegm((2026, 1, 1, 11, 0, 0, 0, 0, 0)) + 0.25
    assert d.iteration == 812 and d.graph is False and d.accept_len is None
    assert d.tokens is None and d.extra["#swa token"] == "4"


def test_no_prefix_at_tp1_and_local_time_by_default():
    d = parse_line("[2026-01-01 12:00:00] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, "
                   "cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0")
    assert d.ranks == {} and d.t == time.mktime(time.strptime("2026-01-01 12:00:00", "%Y-%m-%d %H:%M:%S"))


@pytest.mark.parametrize("line", [
    "[2026-01-01 12:00:04 TP0] Decode batch, #running-req: 4, #token: 5376, token usage: 0.04, "
    "cuda graph: True, gen throughput (token/s): 3O7.10, #queue-req: 0",
    "[2026-01-01 12:00:07 TP0] Decode batch, #running-req: 4, #token: 5",
    "[2026-01-01 12:00:07 TP0] Decode batchy, #running-req: 4",
])
def test_broken_decode_lines_are_errors_not_guesses(line):
    with pytest.raises(LogLineError):
        parse_line(line)
    errors: list[str] = []
    assert parse_lines([line], errors=errors) == [] and len(errors) == 1
    assert "\n" not in errors[0]


def test_samples_use_the_core_series_names():
    samples = to_samples(read_log(LOG, utc_offset_s=UTC))
    by = {}
    for s in samples:
        by.setdefault(s.series, []).append(s.value)
    assert by[S.SERVER_GEN_THROUGHPUT] == [94.12, 301.55, 307.10, 305.77]
    assert by[S.SPEC_ACCEPT_LEN] == [2.95, 3.40, 3.52, 3.48]
    assert by[S.SPEC_ACCEPT_RATE][0] == 0.49
    assert by[S.SERVER_RUNNING] == [1, 4, 4, 4] and by[S.SERVER_QUEUED] == [0, 2, 0, 0]
    assert to_samples(read_log(LOG), dp=1) == []


def test_tail_follows_a_growing_file_and_a_rotation(tmp_path):
    path = tmp_path / "sglang.log"
    text = LOG.read_text()
    cut = text.index("gen throughput (token/s): 301.55")
    path.write_text(text[:cut])
    tail = LogTail(path, utc_offset_s=UTC)
    assert [d.gen_throughput for d in tail.poll()] == [94.12]
    assert tail.poll() == []
    with open(path, "a") as f:
        f.write(text[cut:])
    assert [d.gen_throughput for d in tail.poll()] == [301.55, 307.10, 305.77]
    path.write_text(text.splitlines(keepends=True)[6])          # rotated: a new, shorter file
    assert [d.gen_throughput for d in tail.poll()] == [94.12]
    with open(path, "a") as f:
        f.write("[2026-01-01 12:00:09 TP0] Decode batch, #running-req: x, #queue-req: 0\n")
    assert tail.poll() == [] and len(tail.errors) == 1


# --- adaptive tier lines (adaptive_spec_params.py:263-272, eagle_worker_v2.py:1861-1872) ---------------

def test_tier_lines_policy_and_switch():
    lines = LOG.read_text().splitlines()
    tiers = [t for t in (parse_tier_line(ln, utc_offset_s=UTC) for ln in lines) if t]
    assert [(t.kind, t.old_steps, t.new_steps) for t in tiers] == [("policy", 3, 4), ("switch", 3, 4)]
    assert tiers[0].ema_accept_len == 3.61 and tiers[0].new_draft_tokens is None
    assert (tiers[1].old_draft_tokens, tiers[1].new_draft_tokens) == (4, 5)
    assert tiers[1].t == calendar.timegm((2026, 1, 1, 12, 0, 1, 0, 0, 0)) and tiers[1].ranks == {"TP": 0}
    # log_info_on_rank0's fallback suffix (utils/common.py:3987-3990), a negative EMA, DP prefix:
    odd = parse_tier_line("[2026-01-01 12:00:01.500 DP1 TP0] Adaptive spec params updated: steps 0 -> 1 "
                          "(ema_accept_len=-1.00) (rank-check failed: boom)", utc_offset_s=UTC)
    assert (odd.new_steps, odd.ema_accept_len, odd.dp) == (1, -1.0, 1)
    for other in ("[2026-01-01 12:00:01 TP0] AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1]",
                  "[2026-01-01 12:00:01 TP0] Switch adaptive runtime state: steps x -> 4, draft_tokens 4 -> 5",
                  "Switch adaptive runtime state: steps 3 -> 4, draft_tokens 4 -> 5"):
        assert parse_tier_line(other) is None


def test_tail_gives_decode_and_tier_lines_and_log_samples_keep_their_own_names(tmp_path):
    path = tmp_path / "sglang.log"
    path.write_text(LOG.read_text())
    decodes, tiers = LogTail(path, utc_offset_s=UTC).poll_all()
    assert len(decodes) == 4 and [t.kind for t in tiers] == ["policy", "switch"]
    by: dict[str, list[float]] = {}
    for s in log_samples(decodes, tiers):
        by.setdefault(s.series, []).append(s.value)
    assert by[S.LOG_GEN_THROUGHPUT] == [94.12, 301.55, 307.10, 305.77]
    assert by[S.LOG_ACCEPT_LEN] == [2.95, 3.40, 3.52, 3.48] and by[S.LOG_RUNNING] == [1, 4, 4, 4]
    assert by[S.LOG_TIER_STEPS] == [4.0]
    assert not any(name.startswith(("server/", "spec/")) for name in by)       # never mixed with /metrics'


def test_log_feed_puts_readings_and_tier_moves_on_the_bus(tmp_path):
    from tuner.backends.sglang.managed import LogFeed
    from tuner.core.session import Session

    path = tmp_path / "server.log"
    path.write_text("[2026-01-01 11:59:00 TP0] before the feed started: not this session's\n")
    session = Session()
    feed = LogFeed(path, session.put, session.now)
    with open(path, "a") as f:
        f.write(LOG.read_text())
        f.write("[2026-01-01 12:00:09 TP0] Decode batch, #running-req: x, #queue-req: 0\n")
    assert feed.poll() > 0
    session.tick()
    store = session.store
    assert list(store.window(S.LOG_GEN_THROUGHPUT, 0, math.inf).v) == [94.12, 301.55, 307.10, 305.77]
    [tier] = store.events("adaptive_tier")
    assert (tier.data["old_steps"], tier.data["new_steps"], tier.data["ema_accept_len"]) == (3, 4, 3.61)
    [err] = store.events("poll_error")
    assert err.data["endpoint"] == "server log" and "#running-req" in err.data["error"]
    assert feed.poll() == 0
