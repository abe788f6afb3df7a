"""`tune --schedule` end to end against the real CPU engine (the suite's shared `serve --tp-size 2`,
tiny model, max_running_requests 4) over loopback HTTP, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from harness import ROOT, free_port
from tuner.backends.sglang import SGLangBackend
from tuner.commands.tune_schedule import ScheduleError, check_server


def test_tune_schedule_sweeps_loads_and_exports_a_config(tp2_server, tp2_config, tmp_path):
    url = tp2_server.url
    out, cfg_path = tmp_path / "schedule.json", tmp_path / "adaptive.json"
    # A small space (chains up to 3 steps, the default sharded placement) and loads 1 and 2 only:
    # about 40 s on a busy 2-core machine.
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", url, "--schedule", "--budget", "40s", "--max-load", "2",
         "--max-steps", "3", "--max-new-tokens", "64",
         "--json", str(out), "--adaptive-config", str(cfg_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    text = proc.stdout
    assert "load 1 in flight" in text and "load 2 in flight" in text
    assert "best setting" in text and "stage" in text
    doc = json.loads(out.read_text())
    assert doc["loads"] == [1, 2]
    rows = {b["bucket"]: b for b in doc["buckets"]}
    # The tuner buckets every iteration the server ran, its own load's and anyone else's: the suite
    # shares this server, and a fresh-clone run once saw batches of 4 from another client while the
    # sweep drove 2. Those land in their own bucket above the swept loads, never in 1 or 2.
    assert {"1", "2"} <= set(rows), rows
    assert all(b["bs_lo"] > 2 for k, b in rows.items() if k not in ("1", "2")), rows
    assert (rows["1"]["bs_lo"], rows["1"]["bs_hi"]) == (1, 1) and (rows["2"]["bs_lo"], rows["2"]["bs_hi"]) == (2, 3)
    # Both loads reached the server and were measured.
    assert sum(b["iterations"] for b in rows.values()) > 0
    for load in ("1", "2"):
        after = text.split(f"load {load} in flight", 1)[1]
        assert "measured steps" in after.split("load ", 1)[0] or "measured tier 0" in after
    for b in rows.values():
        assert b["stage"] in ("measured", "predicted-only", "too little data")
        if b["best"] is None:
            # A busy 2-core host can leave a bucket short of settled iterations: then it says so.
            assert b["stage"] == "too little data" and b["reason"] and b["predicted_tok_s"] is None
            continue
        assert b["predicted_tok_s"] > 0
        assert 0 <= b["best"]["speculative_num_steps"] <= 3
        # A schedule's space is chains inside the TP group unless --placements widens it.
        assert b["best"].get("speculative_draft_placement", "sharded") == "sharded"
        assert (b["measured_tok_s"] is not None and b["measured_tok_s"] > 0) == (b["stage"] == "measured")
    # Every pinned bucket's tier is in the config written for SGLang, the smallest key is 1.
    fitted = [b for b in rows.values() if b["best"] is not None]
    if fitted:
        cfg = json.loads(cfg_path.read_text())
        assert cfg == doc["adaptive_config"] and "1" in cfg
        for key, entry in cfg.items():
            assert entry["candidate_steps"] == [rows[key]["sglang_steps"]]
        assert "--speculative-adaptive-config" in doc["flags"]
    else:
        assert doc["adaptive_config"] is None and not cfg_path.exists()
        assert "no bucket has enough data" in text
    # With two buckets fitted, the readout says what the schedule gains over one fixed chain.
    vs = doc["versus_fixed"]
    if len([b for b in rows.values() if b["sglang_steps"] is not None and b["stage"] != "too little data"]) >= 2:
        assert vs is not None and 0 <= vs["fixed_steps"] <= 3
        assert abs(sum(vs["weights"].values()) - 1) < 1e-3 and min(vs["ratios"].values()) >= 1 - 1e-3
        assert vs["gain"] >= 1 - 1e-3 and "against one fixed setting" in text
    else:
        assert vs is None
    # The server runs what it ran before.
    st = httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
    assert st["speculative_num_steps"] == tp2_config["speculative_num_steps"]


@pytest.mark.parametrize("argv, needle", [
    (["--schedule", "--apply"], "--schedule leaves the server"),
    (["--max-load", "4"], "need --schedule"),
    (["--schedule", "--max-load", "0"], "--max-load must be at least 1"),
    (["--max-steps", "0"], "--max-steps must be between 1 and 64"),
    (["--max-steps", "65"], "--max-steps must be between 1 and 64"),
])
def test_schedule_flag_errors_are_one_line(argv, needle):
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "tuner", "tune", url, *argv],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_on_sglang_it_needs_the_plugin_and_an_adaptive_launch():
    b = SGLangBackend(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ScheduleError, match="without the specdecode plugin"):
        check_server(b)
    b.plugin = {"plugin": "specdecode"}
    with pytest.raises(ScheduleError, match="--speculative-adaptive"):
        check_server(b)
    b._take_info({"version": "0.5.23", "internal_states": [{"speculative_adaptive": True}]})
    b.phase_stream = True
    check_server(b)


def test_our_engine_running_its_adaptive_controller_is_refused_in_one_line():
    from tuner.backends.refengine import RefEngineBackend

    b = RefEngineBackend(f"http://127.0.0.1:{free_port()}")
    b.phase_stream = True
    b._take_info({"version": "0.1.0", "internal_states": [{"speculative_num_steps": 3}]})
    check_server(b)
    b._take_info({"version": "0.1.0", "internal_states": [{"speculative_num_steps": 3, "speculative_adaptive": True}]})
    with pytest.raises(ScheduleError, match="adaptive controller") as e:
        check_server(b)
    assert "\n" not in str(e.value)


def test_the_servers_own_traffic_expects_every_bucket_up_to_max_running_requests():
    from tuner.commands.tune_schedule import expected_batches

    assert expected_batches([1, 2, 4], 48, None) == [1, 2, 4]
    assert expected_batches([0], 48, None) == [1, 2, 4, 8, 16, 32, 48]
    assert expected_batches([0], 48, 8) == [1, 2, 4, 8]
