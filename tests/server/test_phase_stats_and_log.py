"""Window statistics from phase records (SGLang's decode-log arithmetic) and the exact log line."""

import re

from refengine.server.decode_log import decode_line, log_line
from refengine.server.phase_stats import PhaseStats


def rec(seq, t, accepted, steps=3, ndt=4, wall_ms=10.0):
    return {"seq": seq, "t": t, "epoch": 0, "steps": steps, "topk": 1, "num_draft_tokens": ndt,
            "placement": "sharded", "bs": len(accepted), "committed": sum(a + 1 for a in accepted),
            "wall_ms": wall_ms, "phase_ms": {"draft": 3.0, "verify": 5.0, "verify_sample": 1.0,
                                               "draft_extend": 1.0, "other": 0.0},
            "comm_ms": {}, "comm_calls": {"draft": 2, "verify": 3}, "accepted": accepted}


def test_window_closes_every_interval_with_sglang_arithmetic():
    ps = PhaseStats(interval=2)
    assert ps.feed([rec(1, 100.0, [3, 1])]) == []
    (w,) = ps.feed([rec(2, 100.5, [0, 2])])
    # 4 request-verifies, 6 correct drafts: accept len (6+4)/4, rate 6/(4*3), 10 tokens / 0.51 s.
    assert w.accept_len == 2.5 and w.accept_rate == 0.5
    assert abs(w.gen_throughput - 10 / 0.51) < 1e-6
    snap = ps.snapshot()
    assert snap["decode_tokens"] == 10 and snap["accept_position"] == {0: 4, 1: 3, 2: 2, 3: 1}
    assert abs(snap["forward_seconds"]["eagle_draft"] - 0.006) < 1e-12
    assert abs(snap["forward_seconds"]["target_verify"] - 0.010) < 1e-12
    assert snap["avg_spec_accept_length"] == 2.5
    assert snap["comm_calls"] == {"draft": 4, "verify": 6}


def test_without_speculation_steps_zero_is_plain_decode():
    ps = PhaseStats(interval=1, speculative=False)
    (w,) = ps.feed([rec(1, 1.0, [0, 0], steps=0, ndt=1)])
    assert w.accept_len == 0.0 and w.tokens == 2
    assert "decode" in ps.snapshot()["forward_seconds"] and ps.snapshot()["accept_position"] == {}


def test_tier_zero_counts_as_verify_rounds_of_one_token():
    """SGLang's decode log counts every tier-0 request-iteration in spec_num_forward_ct with one
    accepted token (metrics_reporter.py 551-553, 973-980): accept len 1.00, rate 0, and the
    target forward is TARGET_VERIFY (eagle_worker_v2.py 1469-1472)."""
    ps = PhaseStats(interval=2)
    ps.feed([rec(1, 1.0, [2, 1])])
    (w,) = ps.feed([rec(2, 1.5, [0, 0], steps=0, ndt=1)])
    assert w.verifies == 4 and w.accept_len == (3 + 4) / 4 and w.accept_rate == 3 / 6
    snap = ps.snapshot()
    assert snap["accept_position"] == {0: 4, 1: 2, 2: 1} and "decode" not in snap["forward_seconds"]
    assert snap["avg_spec_accept_length"] == 7 / 4


def test_decode_line_matches_sglang_format():
    msg = decode_line(running=1, tokens=1234, token_usage=0.01, speculative=True, accept_len=2.95,
                      accept_rate=0.49, device="cuda", gen_throughput=94.12, queued=0)
    assert msg == ("Decode batch, #running-req: 1, #token: 1234, token usage: 0.01, accept len: 2.95, "
                   "accept rate: 0.49, cuda graph: False, gen throughput (token/s): 94.12, #queue-req: 0")
    line = log_line(msg, tp_size=8)
    assert re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Decode batch, ", line)
    assert log_line("x", tp_size=1).endswith("] x") and " TP0" not in log_line("x", tp_size=1)
    plain = decode_line(running=2, tokens=5, token_usage=0.5, speculative=False, accept_len=0,
                        accept_rate=0, device="cpu", gen_throughput=1, queued=3)
    assert "accept len" not in plain and "cpu graph: False" in plain
    assert "cuda graph: True, gen" in decode_line(running=1, tokens=1, token_usage=0, speculative=True, accept_len=1,
                                                  accept_rate=0, device="cuda", gen_throughput=1, queued=0,
                                                  graph=True)
