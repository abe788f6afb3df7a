"""The live tuner against the real engine: `serve --tp-size 2` on CPU over loopback HTTP, with the
emulated slow link so moving the draft off the TP group matters, driven by the real `tune` command."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from harness import ROOT, checked_server

MODEL_ARGS: list[str] = []  # serve's default: the shipped tiny model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow_link_server():
    # 3 ms per collective: a sharded draft step pays several of them, a replicated one none.
    with checked_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0", "--max-running-requests", "2",
                         "--speculative-num-steps", "3", "--emulate-comm-latency", "3000"]) as s:
        yield s


def _tune(url: str, tmp_path, *extra: str, budget: str = "100s") -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "tune.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", url, "--budget", budget, "--load", "2",
         "--max-new-tokens", "64", "--max-steps", "4", "--json", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


def _active(url: str) -> dict:
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    st = info["internal_states"][0]
    return {"steps": st["speculative_num_steps"], "placement": st["speculative_draft_placement"]}


def test_tune_applies_and_explains_on_a_slow_link(slow_link_server, tmp_path):
    url = slow_link_server.url
    rec = tmp_path / "tune.db"
    proc, res = _tune(url, tmp_path, "--apply", "--out", str(rec))
    text = proc.stdout
    assert "tuning from steps 3 topk 1 draft 4 sharded" in text
    assert "predicted vs measured" in text and "fitted costs:" in text
    # The measured collective share of the sharded draft is large on the slowed link ...
    w = res["what_if"] or {}
    model = res["model"]
    sharded = [g for g in model["groups"] if g["placement"] == "sharded" and g["terms"]]
    assert sharded, model["groups"]
    # (The per-step slope needs two sharded depths; on a loaded host the budget may have measured
    # one, and then the what-if's share, from the collectives each measured iteration ran, says it.)
    step = (sharded[0]["terms"]["draft"]["coef"] or {}).get("s-1")
    comm = (sharded[0]["comm"]["draft"]["coef"] or {}).get("s-1")
    if step is not None and comm is not None:
        assert comm["value"] > 0.5 * step["value"] > 0
    else:
        assert w, "neither a sharded draft slope nor a what-if: nothing says the link is slow"
    if w:
        assert w["comm_share"] > 0.5
    # ... so the what-if sends the tuner to measure the draft off the TP group.
    probed = {(m["placement"]) for m in res["measured_tok_s"]}
    assert probed & {"replicated", "rank0"}, probed
    # Every chain setting of the space is predicted, with an error bar.
    chains = [p for p in res["predictions"] if p["steps"] > 0 and p["topk"] == 1]
    assert chains and all(p["tok_s"] is not None and p["sd"] is not None for p in chains)
    # With --apply the server runs what the tuner says it applied.
    assert _active(url) == {"steps": res["applied"]["steps"], "placement": res["applied"]["placement"]
                            if res["applied"]["steps"] else _active(url)["placement"]}
    assert res["applied"] == res["best"]
    # The acceptance-only policy's pick is reported for comparison.
    assert res["acceptance_only"]["steps"] in (1, 3, 5, 7)
    # The recording holds the tuning as events (what `report` reads), with the same result.
    from tuner.core.records import thaw
    from tuner.recording import open_recording

    with open_recording(rec) as reader:
        kinds = [e.kind for e in reader.events() if e.kind.startswith("tuning_")]
        finished = reader.events("tuning_finished")
        assert reader.header["backend"] == "refengine"
    assert kinds[0] == "tuning_started" and kinds[-1] == "tuning_finished"
    assert "tuning_prediction" in kinds and kinds.count("tuning_probe") >= 4
    assert thaw(finished[0].data)["best"] == res["best"]


def test_tune_without_apply_restores_the_starting_setting(slow_link_server, tmp_path):
    url = slow_link_server.url
    httpx.post(f"{url}/set_internal_state", json={"server_args": {
        "speculative_num_steps": 2, "speculative_num_draft_tokens": 3,
        "speculative_draft_placement": "sharded"}}, timeout=60).raise_for_status()
    # A short budget: the tuner stops wherever it is and still puts the server back.
    _, res = _tune(url, tmp_path, budget="25s")
    assert res["initial"]["steps"] == 2
    assert _active(url) == {"steps": 2, "placement": "sharded"}
