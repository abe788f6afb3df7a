"""`serve --speculative-adaptive`: SGLang's adaptive steps on the reference engine, over real HTTP.

One real server (the shipped tiny model in float64, TP1: its acceptance is real) runs a schedule whose policy never leaves its
starting steps (an endless warm-up), so the step an iteration runs is fixed by its batch size
alone: below 4 requests steps 3, from 4 on steps 1. A second schedule, with no warm-up, shows the
policy moving on the accepted drafts the engine feeds it. The records must show the tier that ran with the same epoch throughout, greedy
output must equal tier 0's (the target alone decides each token) across the switches, and the live
controls (install, remove, pin, unpin, the refusals) must behave as SGLang's and its plugin's do.
Bad launch flags are refused in one line by the option parser.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness import checked_server, wait_until
from refengine.server.options import OptionsError, parse_options

SCHEDULE = {"warmup_batches": 10**9, "1": {"candidate_steps": [1, 3]}, "4": {"candidate_steps": [1]}}
PROMPTS = [[5 + i, 17, 3 * i + 2, 40, 9] for i in range(6)]
LENGTHS = [40, 12, 18, 24, 30, 36]       # the batch shrinks as they finish: both tiers run mid-request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("adaptive") / "schedule.json"
    cfg.write_text(json.dumps(SCHEDULE))
    with checked_server(["--port", "0", "--dtype", "float64", "--max-running-requests", "8",
                         "--speculative-adaptive", "--speculative-adaptive-config", str(cfg)]) as s:
        yield s


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _state(http) -> dict:
    return http.get("/server_info").json()["internal_states"][0]


def _set(http, args: dict) -> httpx.Response:
    return http.post("/set_internal_state", json={"server_args": args})


def _end(http) -> int:
    return http.get("/specdecode/phases", params={"after": 10**9}).json()["next"]


def _records(http, after: int) -> list[dict]:
    out: list[dict] = []
    while True:
        page = http.get("/specdecode/phases", params={"after": after, "limit": 4096}).json()
        out += page["records"]
        if not page["records"]:
            return out
        after = page["records"][-1]["seq"]


def _generate(http, prompts, lengths) -> list[list[int]]:
    def one(p, n):
        r = http.post("/generate", json={"input_ids": p, "sampling_params": {"max_new_tokens": n,
                                                                              "temperature": 0, "ignore_eos": True}})
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts, lengths))


def _records_through(http, after: int, n_tokens: int) -> list[dict]:
    """The records after `after` once they account for `n_tokens` decoded tokens (records are published
    after the replies, so wait on the count, not on time)."""
    return wait_until(lambda: (lambda rs: rs if sum(r["committed"] for r in rs) >= n_tokens else None)(
        _records(http, after)), 60, f"records of {n_tokens} tokens")


def test_tiers_follow_the_batch_size_without_a_new_epoch_and_greedy_output_is_unchanged(http):
    st = _state(http)
    assert st["speculative_adaptive"] is True and st["specdecode_num_steps"] == -1
    assert st["speculative_adaptive_config"]["4"]["candidate_steps"] == [1]
    assert st["speculative_adaptive_config"]["4"]["warmup_batches"] == 10**9     # top-level knobs reach every tier
    epoch = st["config_epoch"]
    start = _end(http)
    outs = _generate(http, PROMPTS, LENGTHS)
    # Each request's first token comes from its prefill; the rest from decode iterations.
    recs = _records_through(http, start, sum(LENGTHS) - len(LENGTHS))
    decode = [r for r in recs if r["bs"] > 0]
    assert {r["epoch"] for r in decode} == {epoch}, "a tier switch bumped the epoch"
    assert all(r["adaptive"] is True for r in decode)
    for r in decode:
        want = 1 if r["bs"] >= 4 else 3
        assert (r["steps"], r["num_draft_tokens"]) == (want, want + 1), r
    assert {r["steps"] for r in decode} == {1, 3}, "both tiers ran"
    assert _state(http)["config_epoch"] == epoch

    # Plain decoding: the fixed tier 0 (a one-token verify: the target alone picks each token).
    assert _set(http, {"speculative_adaptive_config": None}).status_code == 200
    try:
        assert _set(http, {"speculative_num_steps": 0}).status_code == 200
        plain = _generate(http, PROMPTS, LENGTHS)
    finally:
        assert _set(http, {"speculative_num_steps": 3}).status_code == 200
        assert _set(http, {"speculative_adaptive_config": SCHEDULE}).status_code == 200
    assert outs == plain


def test_installing_and_removing_a_schedule_bumps_the_epoch(http):
    epoch = _state(http)["config_epoch"]
    r = _set(http, {"speculative_adaptive_config": None})
    assert r.status_code == 200, r.text
    st = _state(http)
    assert st["config_epoch"] == epoch + 1 and st["speculative_adaptive"] is False
    assert st["speculative_adaptive_config"] is None and st["speculative_num_steps"] == 3
    start = _end(http)
    _generate(http, [PROMPTS[0]], [6])
    recs = [r for r in _records_through(http, start, 5) if r["bs"] > 0]
    assert all(r["adaptive"] is False and r["steps"] == 3 and r["epoch"] == epoch + 1 for r in recs)
    # Removing what is not there changes nothing.
    assert _set(http, {"speculative_adaptive_config": None}).status_code == 200
    assert _state(http)["config_epoch"] == epoch + 1
    r = _set(http, {"speculative_adaptive_config": SCHEDULE})
    assert r.status_code == 200, r.text
    st = _state(http)
    assert st["config_epoch"] == epoch + 2 and st["speculative_adaptive"] is True
    assert st["speculative_adaptive_config"]["1"]["candidate_steps"] == [1, 3]


def test_the_policy_moves_on_the_accepted_drafts_without_a_new_epoch(http):
    """From steps 1, with no warm-up and an up-threshold of 0.05 accepted drafts, the EMA of what
    the engine feeds the policy must lift the tier to 3 within one request."""
    climbing = {"warmup_batches": 0, "update_interval": 1, "up_hysteresis": -0.45,
                "1": {"candidate_steps": [1, 3]}}
    assert _set(http, {"speculative_adaptive_config": None}).status_code == 200
    try:
        assert _set(http, {"speculative_num_steps": 1}).status_code == 200
        r = _set(http, {"speculative_adaptive_config": climbing})     # starts at the current steps, 1
        assert r.status_code == 200, r.text
        epoch = _state(http)["config_epoch"]
        start = _end(http)
        _generate(http, [PROMPTS[2]], [40])
        recs = [r for r in _records_through(http, start, 39) if r["bs"] > 0]
        # internal_states shows the tier the policy reached, not the step it started from.
        wait_until(lambda: _state(http)["speculative_num_steps"] == 3, 30, "internal_states to show tier 3")
    finally:
        assert _set(http, {"speculative_adaptive_config": None}).status_code == 200
        assert _set(http, {"speculative_num_steps": 3}).status_code == 200
        assert _set(http, {"speculative_adaptive_config": SCHEDULE}).status_code == 200
    steps = [r["steps"] for r in recs]
    assert steps[0] == 1 and steps[-1] == 3, [(r["steps"], r["accepted"]) for r in recs]
    assert steps == sorted(steps), "the policy went back down"
    assert {r["epoch"] for r in recs} == {epoch} and all(r["adaptive"] for r in recs)


def test_pinning_holds_the_tier_and_minus_one_releases_it(http):
    epoch = _state(http)["config_epoch"]
    r = _set(http, {"specdecode_num_steps": 1})
    assert r.status_code == 200, r.text
    st = _state(http)
    assert st["specdecode_num_steps"] == 1 and st["config_epoch"] == epoch + 1
    start = _end(http)
    _generate(http, [PROMPTS[1]], [8])
    recs = [r for r in _records_through(http, start, 7) if r["bs"] > 0]
    # `adaptive` says the controller chose the steps: a pinned tier is the operator's choice
    assert recs and all(r["bs"] == 1 and r["steps"] == 1 and r["adaptive"] is False for r in recs)
    # The active tier, as SGLang reports it (internal_states and the gauge), not the starting step.
    wait_until(lambda: _state(http)["speculative_num_steps"] == 1, 30, "internal_states to show tier 1")
    assert _state(http)["speculative_num_draft_tokens"] == 2
    gauge = re.search(r"^sglang:spec_num_steps(?:\{[^}]*\})? (\S+)$", http.get("/metrics").text, re.M)
    assert gauge and float(gauge.group(1)) == 1.0
    assert _set(http, {"specdecode_num_steps": -1}).status_code == 200
    assert _state(http)["specdecode_num_steps"] == -1
    start = _end(http)
    _generate(http, [PROMPTS[1]], [8])
    recs = [r for r in _records_through(http, start, 7) if r["bs"] > 0]
    assert recs and all(r["steps"] == 3 for r in recs)


def test_refusals_name_the_way_out(http):
    before = _state(http)
    r = _set(http, {"speculative_num_steps": 2})
    assert r.status_code == 400 and "specdecode_num_steps" in r.text
    r = _set(http, {"speculative_eagle_topk": 2})
    assert r.status_code == 400 and "topk" in r.text
    r = _set(http, {"specdecode_num_steps": 3})            # not a candidate of the bs >= 4 tier
    assert r.status_code == 400 and "batch sizes >= 4" in r.text
    r = _set(http, {"speculative_adaptive_config": {"1": {"candidate_steps": []}}})
    assert r.status_code == 400 and "candidate_steps" in r.text
    r = _set(http, {"speculative_adaptive_config": [1, 2]})
    assert r.status_code == 400 and "null" in r.text
    assert _state(http)["config_epoch"] == before["config_epoch"]
    # Fixed setting: a tree is fine, but a schedule on top of it is SGLang's refusal, and a pin needs one.
    assert _set(http, {"speculative_adaptive_config": None}).status_code == 200
    try:
        r = _set(http, {"speculative_eagle_topk": 2, "speculative_adaptive_config": SCHEDULE})
        assert r.status_code == 400 and "topk" in r.text
        r = _set(http, {"specdecode_num_steps": 1})
        assert r.status_code == 400 and "speculative_adaptive_config" in r.text
    finally:
        assert _set(http, {"speculative_adaptive_config": SCHEDULE}).status_code == 200


def _refused(argv: list[str]) -> str:
    with pytest.raises(OptionsError) as e:
        parse_options(argv)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


@pytest.mark.parametrize("content, words", [
    (None, "No such file"),
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"one": {"candidate_steps": [1]}}', "unknown key 'one'"),
    ('{"0": {"candidate_steps": [1]}}', ">= 1"),
    ('{"1": {"candidate_steps": []}}', "candidate_steps"),
    ('{"1": {"candidate_steps": [1, -2]}}', "candidate_steps"),
    ('{"1": {"steps": [1]}}', "unknown key 'steps'"),
    ('{"1": {"candidate_steps": [1], "ema_alpha": 2}}', "ema_alpha"),
    ('{"warmup_batches": 1.5, "1": {"candidate_steps": [1]}}', "warmup_batches"),
    ('{"ema_alpha": 0.5}', "no batch-size thresholds"),
])
def test_bad_config_files_are_refused_in_one_line(tmp_path: Path, content, words):
    path = tmp_path / "cfg.json"
    if content is not None:
        path.write_text(content)
    msg = _refused(["--speculative-adaptive", "--speculative-adaptive-config", str(path)])
    assert msg.startswith("--speculative-adaptive-config: ") and words in msg, msg


def test_bad_adaptive_launches_are_refused_in_one_line(tmp_path: Path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(SCHEDULE))
    assert "needs --speculative-adaptive" in _refused(["--speculative-adaptive-config", str(path)])
    assert "topk 1" in _refused(["--speculative-adaptive", "--speculative-eagle-topk", "2"])
    assert "one of the adaptive candidate steps [1, 3]" in _refused(
        ["--speculative-adaptive", "--speculative-adaptive-config", str(path), "--speculative-num-steps", "2"])
    assert "draft model" in _refused(["--speculative-adaptive", "--speculative-algorithm", "NONE"])
    ok = parse_options(["--speculative-adaptive"])           # SGLang's default tiers, middle of the first
    assert ok.adaptive_schedule["8"]["candidate_steps"] == [0, 1, 3] and ok.speculative_num_steps == 5


def test_the_ranks_of_a_tp2_server_follow_one_moving_schedule(tp2_server, tp2_config):
    """Every rank runs its own controller on the same accepted drafts: they must choose alike (a
    rank that drafted another depth would desynchronise the collectives), while the policy moves."""
    moving = {"warmup_batches": 0, "update_interval": 1, "1": {"candidate_steps": [1, 3]},
              "3": {"candidate_steps": [0, 1]}}
    with httpx.Client(base_url=tp2_server.url, timeout=120) as h:
        r = _set(h, {"speculative_adaptive_config": moving})
        assert r.status_code == 200, r.text
        try:
            epoch = _state(h)["config_epoch"]
            start = _end(h)
            outs = _generate(h, PROMPTS[:4], [30, 8, 12, 16])
            recs = [r for r in _records_through(h, start, 66 - 4) if r["bs"] > 0]
        finally:
            assert _set(h, {"speculative_adaptive_config": None}).status_code == 200
    assert all(len(o) == n for o, n in zip(outs, [30, 8, 12, 16]))
    assert {r["epoch"] for r in recs} == {epoch} and all(r["adaptive"] for r in recs)
    assert {r["steps"] for r in recs if r["bs"] >= 3} <= {0, 1} and {r["steps"] for r in recs if r["bs"] < 3} <= {1, 3}
    assert len({r["steps"] for r in recs}) >= 2, [(r["bs"], r["steps"]) for r in recs]
