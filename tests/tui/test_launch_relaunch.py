"""Managed mode end to end: `specdecode-tune launch --server-kind sglang -- specdecode-tune serve …`
with the TUI driven in-process (Textual's pilot through `launch.run(..., run_app=…)`).

The managed server is the reference engine's `serve` (real child process, real HTTP, tiny preset on
CPU) treated as SGLang 0.5.23 without the plugin, so topk can change only by a relaunch: the `t`
key offers it, `y` confirms, and the facts are checked where they are recorded — the relaunched
server's own /server_info, the session's events, the event log, the recording file — plus the
decode lines the server's log fed into the store.
"""

from __future__ import annotations

import asyncio
import math
import sys

import httpx
import pytest

from harness import free_port
from probes.names import DRAFT_TOKENS, STEPS, TOPK
from tuner.cli import build_parser
from tuner.commands import launch
from tuner.core import series as S
from tuner.recording.reader import open_recording
from tuner.screens.relaunch import RelaunchConfirm

from .helpers import wait_for

pytestmark = pytest.mark.slow


def _serve(port: int) -> list[str]:
    return [sys.executable, "-m", "tuner", "serve", "--model-path", "tiny-agreeing", "--load-format", "dummy",
            "--device", "cpu", "--tp-size", "1", "--host", "127.0.0.1", "--port", str(port),
            "--skip-server-warmup", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--decode-log-interval", "4"]


def test_a_restart_only_key_relaunches_the_managed_server_and_the_tui_follows(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    record = tmp_path / "managed.db"
    args = build_parser().parse_args([
        "launch", "--server-kind", "sglang", "--log", str(tmp_path / "server.log"), "--ready-timeout", "240",
        "--record", str(record), "--load", "2", "--max-new-tokens", "24", "--", *_serve(port)])
    seen: dict = {}

    async def scenario(app) -> None:
        async with app.run_test(size=(140, 44)) as pilot:
            session = app.session
            await wait_for(pilot, lambda: session.active_config().get(TOPK) == 1, why="the first read-back")
            assert TOPK in app.control_state().relaunch and "no_such_knob" not in app.control_state().relaunch
            await wait_for(pilot, lambda: len(session.store.window(S.LOG_GEN_THROUGHPUT, 0, math.inf)),
                           timeout=120, why="decode lines read from the server's log")
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, RelaunchConfirm), why="t offers a relaunch")
            seen["command"] = app.screen.command
            await pilot.press("y")
            await wait_for(pilot, lambda: session.store.events("relaunch_ready") or session.store.events(
                "relaunch_failed"), timeout=300, why="the relaunch ended")
            await wait_for(pilot, lambda: session.active_config().get(TOPK) == 2, timeout=60,
                           why="the TUI reads the relaunched server")
            await wait_for(pilot, lambda: "relaunched with" in app.main.query_one("#events").plain(),
                           why="the relaunch in the event log")
            seen["info"] = httpx.get(url + "/server_info", timeout=30, trust_env=False).json()
            seen["kinds"] = [e.kind for e in session.store.events()]
            seen["bar"] = str(app.main.query_one("#capture-bar").render())
            seen["connected"] = session.connection().connected

    rc = launch.run(args, run_app=lambda app: asyncio.run(scenario(app)))
    assert rc == 0
    assert "--speculative-eagle-topk 2 --speculative-num-draft-tokens 4" in seen["command"]
    state = seen["info"]["internal_states"][0]
    assert (state[STEPS], state[TOPK], state[DRAFT_TOKENS]) == (3, 2, 4)       # the server itself says so
    assert seen["info"]["speculative_eagle_topk"] == 2                           # launched with it, not set live
    kinds = seen["kinds"]
    assert "relaunch_failed" not in kinds
    assert kinds.index("relaunch_started") < kinds.index("relaunch_ready")
    assert kinds.count("server_info") >= 2 and seen["connected"] and seen["bar"] == ""
    with open_recording(record) as rec:
        ready = rec.events("relaunch_ready")
        assert len(ready) == 1 and dict(ready[0].data["changes"]) == {TOPK: 2, DRAFT_TOKENS: 4}
        assert rec.events("relaunch_started") and S.LOG_GEN_THROUGHPUT in rec.series_names()
    with pytest.raises(httpx.HTTPError):                 # launch stopped what it started
        httpx.get(url + "/health", timeout=2, trust_env=False)
