"""`specdecode-tune doctor` against real HTTP servers: the SGLang stand-in with the plugin (every
capability present), the same without the plugin (each missing capability with its fix, exit 1),
and the reference engine (`serve`, everything built in). A dead URL is one line and exit 2.

sglang_payload_server.py is a STAND-IN for SGLang 0.5.23 (it serves recorded-shape payloads; SGLang
cannot run here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("sglang_payload_server.py")


def _standin(*flags: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), *flags], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, f"http://127.0.0.1:{port}"


def _doctor(url: str, *args: str) -> tuple[int, dict | None, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tuner", "doctor", url, *args], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT)
    body = json.loads(out.stdout) if out.stdout.strip().startswith("{") else None
    return out.returncode, body, out.stdout + out.stderr


@pytest.fixture(scope="module")
def sglang_with_plugin():
    proc, url = _standin()
    yield url
    proc.kill()
    proc.wait(10)


@pytest.fixture(scope="module")
def sglang_alone():
    proc, url = _standin("--no-plugin")
    yield url
    proc.kill()
    proc.wait(10)


def _by_name(body: dict) -> dict[str, dict]:
    return {c["capability"]: c for c in body["checks"]}


def test_sglang_with_the_plugin_has_everything(sglang_with_plugin):
    # The recorded payload is plugin 1's, which publishes no pinnable tiers: live steps are not
    # judged then (test_launch_shapes covers plugin 2 on SGLang's real adaptive classes).
    rc, body, text = _doctor(sglang_with_plugin, "--json", "--wait-s", "3")
    assert rc == 0, text
    checks = _by_name(body)
    live = checks.pop("live steps")
    assert live["status"] == "unknown" and "upgrade the plugin" in live["fix"]
    assert all(c["status"] == "ok" for c in checks.values()), checks
    assert checks["plugin in the schedulers"]["found"] == "TP ranks 0, 1, 2, 3, 4, 5, 6, 7"
    assert "iterations timed" in checks["phase timers"]["found"]


def test_sglang_without_the_plugin_says_what_is_missing_and_the_fix(sglang_alone):
    rc, body, text = _doctor(sglang_alone, "--json", "--wait-s", "0.5")
    assert rc == 1, text
    checks = _by_name(body)
    assert checks["speculation"]["status"] == "ok" and checks["metrics (/metrics)"]["status"] == "ok"
    assert checks["GPU time per graph"]["status"] == "missing"
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1" in checks["GPU time per graph"]["fix"]
    assert checks["plugin routes (HTTP)"]["status"] == "missing"
    assert "pip install --no-deps specdecode-tune" in checks["plugin routes (HTTP)"]["fix"]
    for name in ("plugin in the schedulers", "phase timers", "phase stream", "live steps"):
        assert checks[name]["status"] == "missing" and "plugin" in checks[name]["fix"], name
    assert "--speculative-adaptive" in checks["live steps"]["fix"]
    rc, _, text = _doctor(sglang_alone, "--wait-s", "0.5")     # the table people read
    assert rc == 1 and "NO  plugin routes (HTTP)" in text and "fix: install the plugin" in text


def test_the_reference_engine_has_everything_built_in(tp2_server):
    rc, body, text = _doctor(tp2_server.url, "--json", "--wait-s", "20", "--probe")
    checks = _by_name(body)
    assert rc == 0, text
    assert checks["ranks reporting"]["found"] == "TP ranks 0, 1"
    assert checks["phase timers"]["status"] == "ok"
    assert "plugin routes (HTTP)" not in checks


def test_a_dead_url_is_one_line_and_exit_2():
    rc, body, text = _doctor(f"http://127.0.0.1:{free_port()}")
    assert rc == 2 and body is None and len(text.strip().splitlines()) == 1 and "doctor:" in text
