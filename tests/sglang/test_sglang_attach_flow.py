"""attach → readings → live control, end to end through the CLI, against the payload stand-in.

sglang_payload_server.py is a STAND-IN for SGLang 0.5.23 with our plugin (SGLang cannot run
here): a real HTTP server on loopback serving the recorded-shape fixtures, moving with time.
`specdecode-tune once` is the headless attach: it connects, detects SGLang and the plugin, takes
the timer lease, reads /metrics, /server_info and the phase stream, and applies a live change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(start_payload_server):
    with start_payload_server() as u:
        yield u


def _once(url, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tuner", "once", url, "--seconds", "2.5", "--json", *args],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip().startswith("{") else None), out.stderr


def test_attach_reads_sglang_and_the_plugin(url):
    rc, r, err = _once(url)
    assert rc == 0, err
    assert r["server"]["kind"] == "sglang" and r["server"]["version"] == "0.5.23"
    assert r["active"]["speculative_num_steps"] == 4           # internal_states, not the launch's 3
    assert r["tok_per_s"] == pytest.approx(299, rel=0.1)
    assert r["iter_per_s"] == pytest.approx(22, rel=0.15)
    assert r["phase_ms"]["draft"] == pytest.approx(12.0) and r["phase_ms"]["verify"] == pytest.approx(24.0)
    assert r["phase_ms"]["verify_sample"] == pytest.approx(2.5)
    assert r["has_phase_timers"] is True
    assert r["live"]["speculative_num_steps"] == "live"
    assert "relaunch" in r["live"]["speculative_eagle_topk"]


def test_live_steps_go_through_the_plugin_key(url):
    rc, r, err = _once(url, "--set", "speculative_num_steps=2")
    assert rc == 0, err
    assert r["active"]["speculative_num_steps"] == 2
    info = httpx.get(url + "/server_info", trust_env=False).json()
    assert info["speculative_num_steps"] == 3 and info["internal_states"][0]["speculative_num_steps"] == 2
    rc, r, err = _once(url, "--set", "speculative_num_steps=7")     # not a captured tier
    assert rc == 1 and "refused" in err
    rc, r, err = _once(url, "--set", "speculative_num_steps=4")
    assert rc == 0 and r["active"]["speculative_num_steps"] == 4
