"""The three SGLang launches a new user starts from, end to end: `doctor`'s verdict and fix, and the
steps the TUI (and `once`, `tune`) offer.

1. the default adaptive launch (`--speculative-adaptive`, SGLang's DEFAULT_ADAPTIVE_CONFIG, steps 3,
   48 requests at most, decode graphs up to 48);
2. the same server relaunched with what `specdecode-tune sglang-flags --steps 1,2,3,5,7` wrote;
3. shape 2 without `--enable-metrics` (no /metrics).

SGLang cannot run here. Each launch is the payload stand-in (sglang_payload_server.py, a real HTTP
server), serving a /server_info whose `internal_states[0]` adaptive keys are not typed in: they are
what SGLang's own `get_internal_state` returns through the plugin's hook, with SGLang's real
AdaptiveSpeculativeParams and AdaptiveController built from that launch's config
(sglang_scheduler.py). For shape 2 that config is the file `sglang-flags` wrote against shape 1 over
HTTP, so it also parses with SGLang's own `_load_adaptive_config`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness import free_port
from types import SimpleNamespace

import torch

from probes.inserver.sglang_comm import allreduce_report
from probes.names import ALLREDUCE_PATHS, PINNABLE_STEPS, STEPS
from probes.sglang_tiers import decode_graph_bs, runners
from sglang_scheduler import internal_state, scheduler_env, server
from sglang_wheel_code import load_method

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("sglang_payload_server.py")
FIX = Path(__file__).with_name("fixtures") / "server_info_adaptive.json"
MAX_BS, LAUNCH = 48, 3
# What each shape's state carries over from SGLang's get_internal_state (the rest is the recorded
# TP8 payload: model, versions, the launch's other args).
FROM_SGLANG = ("effective_max_running_requests_per_dp", "memory_usage", PINNABLE_STEPS)


def _server_info(sglang_target: Path, tmp: Path, cfg: Path | None, out: Path) -> dict:
    with pytest.MonkeyPatch.context() as mp, scheduler_env(sglang_target, tmp / "stream", mp) as ns:
        _, ctl = server(ns, None if cfg is None else str(cfg), adaptive=True, graph_bs=decode_graph_bs(MAX_BS),
                        launch_steps=LAUNCH, max_running_requests=MAX_BS)
        st = internal_state(ctl)
        params = ctl.scheduler.draft_worker.adaptive_controller.params
        real_graphs = sum(runners(s) * len(decode_graph_bs(MAX_BS) if s == LAUNCH else params.cuda_graph_bs_for_step(s))
                          for s in params.candidate_steps)
    info = json.loads(FIX.read_text())
    info.update(speculative_num_steps=LAUNCH, speculative_num_draft_tokens=LAUNCH + 1, max_running_requests=MAX_BS,
                speculative_adaptive_config=None if cfg is None else str(cfg))
    s0 = info["internal_states"][0]
    s0.update({k: st[k] for k in FROM_SGLANG})
    s0[ALLREDUCE_PATHS] = _pcie_tp8_report(sglang_target)
    s0.update(speculative_num_steps=LAUNCH, speculative_num_draft_tokens=LAUNCH + 1,
              speculative_adaptive_config=info["speculative_adaptive_config"])
    out.write_text(json.dumps(info))
    return {"graphs": real_graphs, "state": st}


def _pcie_tp8_report(sglang_target: Path) -> dict:
    """What the plugin reports for a TP8 group on 8 PCIe GPUs without the env: SGLang's own
    `_resolve_outplace_all_reduce_method` (from the wheel) over a stand-in group whose custom
    all-reduce is disabled (more than 2 PCIe-only GPUs, sglang-draft-placement.md §6) and that has
    no PCIe-IPC communicator; `is_in_tc_piecewise_cuda_graph` is a stand-in (off)."""
    resolve = load_method(sglang_target / "sglang", "sglang.srt.distributed.parallel_state", "GroupCoordinator",
                          "_resolve_outplace_all_reduce_method",
                          {"is_in_tc_piecewise_cuda_graph": lambda: False, "torch": torch})
    ca = SimpleNamespace(disabled=True, full_nvlink=False, should_custom_ar=lambda t: False)
    group = SimpleNamespace(world_size=8, ca_comm=ca, pcie_ipc_comm=None, qr_comm=None, pymscclpp_comm=None,
                            torch_symm_mem_comm=None, pynccl_comm=object())
    group._resolve_outplace_all_reduce_method = lambda t, **kw: resolve(group, t, **kw)
    return allreduce_report(group, 8192, decode_graph_bs(MAX_BS), LAUNCH + 1,
                            lambda rows: torch.empty((rows, 8192), dtype=torch.bfloat16),
                            full_nvlink=False, env_pcie_ipc=False, deterministic=False)


def _start(*args: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, f"http://127.0.0.1:{port}"


def _cli(*args: str, cwd: Path = ROOT) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120,
                         env=env, cwd=cwd)
    return out.returncode, out.stdout, out.stderr


@pytest.fixture(scope="module")
def shapes(sglang_target, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    procs = []
    try:
        default = _server_info(sglang_target, tmp, None, tmp / "default.json")
        p1, url1 = _start("--server-info", str(tmp / "default.json"))
        procs.append(p1)
        cfg = tmp / "adaptive.json"
        rc, out, err = _cli("sglang-flags", "--from", url1, "--steps", "1,2,3,5,7", "--out", str(cfg), "--json")
        assert rc == 0, err
        plan = json.loads(out)
        flags = _server_info(sglang_target, tmp, cfg, tmp / "flags.json")
        p2, url2 = _start("--server-info", str(tmp / "flags.json"))
        p3, url3 = _start("--server-info", str(tmp / "flags.json"), "--no-metrics")
        procs += [p2, p3]
        yield {"default": url1, "flags": url2, "no_metrics": url3, "plan": plan, "cfg": cfg,
               "default_info": default, "flags_info": flags}
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def _doctor(url: str, *args: str) -> tuple[int, dict]:
    rc, out, err = _cli("doctor", url, "--json", "--wait-s", "2", *args)
    assert out.startswith("{"), out + err
    body = json.loads(out)
    return rc, {c["capability"]: c for c in body["checks"]}


# -- 1. the default adaptive launch -------------------------------------------------------------

def test_default_launch_publishes_partial_tiers_from_sglangs_routing(shapes):
    pin = shapes["default_info"]["state"][PINNABLE_STEPS]
    # The launch's tier has graphs everywhere; 5 and 7 only where slot 1 routes (graph sizes 1..7)
    assert pin["steps"] == {"0": [[8, 48]], "1": [[1, 48]], "3": [[1, 48]], "5": [[1, 7]], "7": [[1, 7]]}


def test_doctor_on_the_default_launch_names_where_each_tier_holds_and_the_fix(shapes):
    rc, checks = _doctor(shapes["default"])
    live = checks["live steps"]
    assert rc == 0 and live["status"] == "ok", live
    assert "pinnable everywhere: 1, 3" in live["found"]
    assert "0 at bs 8-48; 5 at bs 1-7; 7 at bs 1-7" in live["found"]
    assert "sglang-flags --from URL --steps 0,1,3,5,7" in live["fix"]


def test_once_refuses_an_unpinnable_step_with_the_slots_and_the_fix(shapes):
    rc, out, err = _cli("once", shapes["default"], "--seconds", "1", "--json", "--set", f"{STEPS}=2")
    assert rc == 1
    assert "steps 2 cannot be pinned on this launch: no batch-size slot lists it" in err
    assert "bs ≥ 8: [0, 1, 3]" in err and "sglang-flags --from URL --steps 0,1,2,3,5,7" in err
    rc, out, err = _cli("once", shapes["default"], "--seconds", "1", "--json", "--set", f"{STEPS}=5")
    assert rc == 0, err
    r = json.loads(out)
    assert r["active"][STEPS] == 5
    assert r["live_values"][STEPS] == [0, 1, 3, 5, 7]
    assert r["value_notes"][STEPS] == {"0": "pinned at bs 8-48 only", "5": "pinned at bs 1-7 only",
                                       "7": "pinned at bs 1-7 only"}
    httpx.post(shapes["default"] + "/set_internal_state", json={"server_args": {"specdecode_num_steps": LAUNCH}},
               trust_env=False)


# -- 2. relaunched with sglang-flags' output -----------------------------------------------------

def test_sglang_flags_output_parses_in_sglang_and_pins_every_tier_everywhere(shapes):
    plan, cfg = shapes["plan"], json.loads(shapes["cfg"].read_text())
    assert list(cfg) == ["1", "8", "32", "64"]
    assert cfg["1"]["down_hysteresis"] == -0.25 and cfg["8"]["down_hysteresis"] == 0.0   # knobs kept
    pin = shapes["flags_info"]["state"][PINNABLE_STEPS]          # SGLang's own _route over the new file
    for s in (1, 2, 3, 5, 7):
        assert pin["steps"][str(s)] == [[1, MAX_BS]], s
    assert plan["pinnable_after"] == {k: v for k, v in pin["steps"].items()}
    # the graph count sglang-flags printed is SGLang's cuda_graph_bs_for_step over the new config
    assert plan["graphs_after"] == shapes["flags_info"]["graphs"]
    assert plan["graphs_before"] == shapes["default_info"]["graphs"]
    assert "--speculative-adaptive-config" in plan["flags"] and plan["memory_gb"]["target_verify"] > 0


def test_doctor_after_the_relaunch_says_every_tier_is_pinnable(shapes):
    rc, checks = _doctor(shapes["flags"])
    assert rc == 0, checks
    live = checks["live steps"]
    assert live["status"] == "ok" and "pinnable everywhere: 1, 2, 3, 5, 7" in live["found"]
    assert all(c["status"] == "ok" for c in checks.values()), checks


def test_sglang_flags_text_says_what_changes(shapes, tmp_path):
    rc, out, err = _cli("sglang-flags", "--from", shapes["default"], "--steps", "2", "--out",
                        str(tmp_path / "a.json"), "--freeze-policy")
    assert rc == 0, err
    assert "steps 2: now not pinnable → every batch size (bs 1-48)" in out
    assert "frozen: SGLang's controller stays on its start tier" in out
    assert json.loads((tmp_path / "a.json").read_text())["8"]["warmup_batches"] == 1_000_000_000


# -- 3. the plugin without --enable-metrics -------------------------------------------------------

def test_doctor_without_metrics_takes_ranks_and_timers_from_the_plugin(shapes):
    rc, checks = _doctor(shapes["no_metrics"])
    assert rc == 1
    assert checks["metrics (/metrics)"]["status"] == "missing"
    assert "--enable-metrics" in checks["metrics (/metrics)"]["fix"]
    gpu = checks["GPU time per graph"]
    assert "--enable-metrics" in gpu["fix"] and "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1" in gpu["fix"]
    assert checks["plugin routes (HTTP)"]["status"] == "ok"
    ranks = checks["plugin in the schedulers"]
    assert ranks["status"] == "ok" and "from their phase streams" in ranks["found"], ranks
    assert checks["phase timers"]["status"] == "ok" and "phase stream" in checks["phase timers"]["found"]
    assert checks["live steps"]["status"] == "ok"
    assert not any("install the plugin" in c["fix"] for c in checks.values()), checks
    rc, _ = _doctor(shapes["no_metrics"], "--require", "plugin,ranks,timers,stream,live-steps")
    assert rc == 0
    rc, _ = _doctor(shapes["no_metrics"], "--require", "metrics")
    assert rc == 1


def test_doctor_require_unknown_and_unreachable():
    rc, out, err = _cli("doctor", "http://127.0.0.1:1", "--require", "warp-drive")
    assert rc == 2 and "unknown capability warp-drive" in err
    rc, out, err = _cli("doctor", f"http://127.0.0.1:{free_port()}", "--require", "plugin")
    assert rc == 2 and len((out + err).strip().splitlines()) == 1


def test_once_without_metrics_names_the_flag_and_what_still_works(shapes):
    rc, out, err = _cli("once", shapes["no_metrics"], "--seconds", "1.5")
    assert rc == 0, err
    assert "missing   no /metrics (SGLang was launched without --enable-metrics)" in out
    assert "relaunch SGLang with --enable-metrics" in out
    assert "still works: the load driver's own tok/s and acceptance histograms" in out
    # the remedy SGLang allows, said the same way as in the TUI (a capture gives the prediction)
    assert "remedy    steps: live among the pinnable tiers 0 1 2 3 5 7" in out
    assert "remedy    all-reduce path (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1): n/a, needs a capture (c)" in out
    assert "the plugin reports NCCL on a PCIe-only TP group" in out


# -- the TUI offers exactly the pinnable steps ---------------------------------------------------

def _tui(url: str, keys: list[str], notice_shown: bool = False):
    """Press `keys` in the TUI attached to `url`; returns (the steps the server ran after each key,
    the knobs panel's text, the notice panel's text, notifications)."""
    from tuner.app import make_app
    from tuner.backends import connect
    from tuner.core.session import Session
    from tuner.widgets.knobs import KnobsPanel
    from tui.helpers import wait_for

    def steps() -> int:
        raw = httpx.get(url + "/server_info", trust_env=False).json()
        return raw["internal_states"][0][STEPS]

    async def scenario():
        session = Session(connect(url))
        app = make_app(session, load=0)
        seen, notes = [], []
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: session.active_config().get(STEPS) == LAUNCH, why="the first read-back")
            for key in keys:
                before = steps()
                await pilot.press(key)
                await wait_for(pilot, lambda: steps() != before or bool(app._notifications), why=f"{key} acted")
                await wait_for(pilot, lambda: session.active_config().get(STEPS) == steps(), why="read back")
                seen.append(steps())
                notes += [n.message for n in app._notifications]
                app.clear_notifications()
            if notice_shown:
                await wait_for(pilot, lambda: app.screen.query_one("#notice").display, why="the notice panel")
            knobs = str(app.screen.query_one("#knobs", KnobsPanel).render())
            notice = str(app.screen.query_one("#notice").render())
        session.close()
        return seen, knobs, notice, notes
    return asyncio.run(scenario())


@pytest.mark.parametrize("shape, keys, ran, tiers", [
    ("default", ["plus", "plus", "plus", "minus", "minus", "minus", "minus"], [5, 7, 7, 5, 3, 1, 0], "0 1 3 5 7"),
    ("flags", ["minus", "plus", "plus"], [2, 3, 5], "0 1 2 3 5 7"),
])
def test_the_tui_steps_through_exactly_the_pinnable_tiers(shapes, shape, keys, ran, tiers):
    seen, knobs, notice, notes = _tui(shapes[shape], keys)
    assert seen == ran
    assert f"tiers {tiers}" in knobs
    if shape == "default":
        assert any("steps 7 is the deepest this server can set live" in n for n in notes), notes
        assert "steps 0 pinned at bs 8-48 only" in knobs          # the last key left it at 0
    assert notice == ""


def test_the_tui_without_metrics_shows_what_is_missing_and_the_fix(shapes):
    _, _, notice, _ = _tui(shapes["no_metrics"], [], notice_shown=True)
    assert "launched without --enable-metrics" in notice and "relaunch SGLang with --enable-metrics" in notice
    assert "still works" in notice


def test_the_capture_analysis_in_the_tui_predicts_the_pcie_ipc_relaunch(shapes):
    """The analysis screen after a capture on the PCIe TP8 launch: the remedy SGLang allows, with
    its prediction from the capture's per-phase all-reduces, and draft placement for reference."""
    from tuner.app import make_app
    from tuner.backends import connect
    from tuner.core.session import Session
    from tuner.screens.trace import TraceScreen
    from tui.helpers import wait_for

    def ph(ms, comm, ar, calls):
        return {"ms": ms, "comm_ms": comm, "ar_ms": ar, "ar_calls": calls, "comm_calls": calls + 1, "span_ms": ms}
    mean = {"wall_ms": 24.0, "phases": {"draft": ph(8.0, 5.0, 4.0, 6), "verify": ph(12.0, 4.0, 3.5, 161),
                                        "draft_extend": ph(3.0, 1.5, 1.2, 3), "verify_sample": ph(0.5, 0, 0, 0),
                                        "other": ph(0.2, 0, 0, 0)}}
    analysis = {"mode": "gpu", "phases": list(mean["phases"]), "ranks": [{"rank": 0, "mean": mean}]}

    async def scenario():
        session = Session(connect(shapes["default"]))
        app = make_app(session, load=0)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: session.server_info().get("allreduce"), why="the plugin's report")
            app.push_screen(TraceScreen(analysis))
            await pilot.pause()
            text = str(app.screen.query_one("#trace-remedies").render())
            await pilot.press("r")                       # attach owns no server: it says so
            await pilot.pause()
            notes = [n.message for n in app._notifications]
        session.close()
        return text, notes
    text, notes = asyncio.run(scenario())
    assert "steps: live among the pinnable tiers 0 1 3 5 7" in text
    assert "relaunch with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1: decode iteration 24.00 →" in text
    assert "pcie_ipc_ar.py" in text and "not an SGLang 0.5.23 setting, for reference" in text
    assert "to apply: relaunch the server with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in text
    assert any("only a server `specdecode-tune launch` owns" in n for n in notes), notes


@pytest.mark.parametrize("size", [(100, 30), (80, 24)])
def test_the_no_metrics_notice_leaves_the_small_terminal_checks_standing(shapes, size):
    """The notice is a panel this issue adds: the small-terminal rules (tests/tui/test_small_terminals)
    hold with it shown: at 100x30 the header, the phase split, the A/B panel and the footer's keys;
    at 80x24 the A/B line and u, ? and q."""
    from tuner.app import make_app
    from tuner.backends import connect
    from tuner.core.session import Session
    from tui.helpers import screen_lines, wait_for

    def standing(rows: list[str]) -> bool:
        has = lambda text: any(text in r for r in rows)      # noqa: E731
        return (rows[0].startswith(" specdecode-tune ▸ sglang") and has("launched without --enable-metrics")
                and has("change a setting to compare")       # the A/B panel
                and all(key in rows[-1] for key in ("u tune", "? help", "q quit"))
                and (size != (100, 30) or (has("decode iteration") and has("█ verify"))))

    async def scenario():
        session = Session(connect(shapes["no_metrics"]))
        app = make_app(session, load=0)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.screen.query_one("#notice").display, why="the notice panel")
            await wait_for(pilot, lambda: any("█ verify" in r for r in screen_lines(app)), why="the phase split")
            # Panels settle over a few ticks once the phase split is in (the what-if line, the A/B's
            # words): the rules must hold once they have, all on one screen.
            await wait_for(pilot, lambda: standing(screen_lines(app)), why="the small-terminal checks, all at once")
        session.close()
    asyncio.run(scenario())
