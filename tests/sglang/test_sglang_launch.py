"""Managed mode: argument rewriting (pure) and the owned server process (real child processes).

The child is standin_sglang_server.py, a STAND-IN for SGLang (which cannot run here) that serves
real HTTP on loopback and spawns a grandchild like SGLang's schedulers; the reference engine's
`python -m refengine serve` is used where it can start on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness import free_port

from tuner.backends.sglang.args import (
    ArgsError, Launch, adaptive_candidates, apply_settings, check_command, get_arg, pinning_config,
    runs_already, server_url, set_arg, with_pinning,
)
from tuner.backends.sglang.launch import LaunchError, ManagedServer

ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_sglang_server.py")
BASE = ("python", "-m", "sglang.launch_server", "--model-path", "m", "--tp-size", "8",
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps=3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


# --- pure argument rewriting ------------------------------------------------------------------

def test_get_and_set_understand_both_spellings_and_aliases():
    argv = list(BASE) + ["--tensor-parallel-size", "4", "--enable-metrics"]
    assert get_arg(argv, "speculative_num_steps") == "3"
    assert get_arg(argv, "tp_size") == "4"                 # the last spelling wins, as argparse
    assert get_arg(argv, "enable_metrics") is True and get_arg(argv, "speculative_adaptive") is None
    out = set_arg(argv, "tp_size", 2)
    assert "--tensor-parallel-size" not in out and out[-2:] == ["--tp-size", "2"]
    assert out.count("--tp-size") == 1
    assert "--enable-metrics" not in set_arg(argv, "enable_metrics", False)


def test_steps_change_keeps_sglangs_rules():
    got = apply_settings(Launch(BASE), {"speculative_num_steps": 5})
    assert get_arg(list(got.argv), "speculative_num_steps") == "5"
    assert get_arg(list(got.argv), "speculative_num_draft_tokens") == "6"     # topk 1: steps + 1
    assert list(got.argv[:8]) == list(BASE[:8])
    tree = apply_settings(Launch(BASE), {"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8})
    assert [get_arg(list(tree.argv), k) for k in ("speculative_num_steps", "speculative_eagle_topk",
                                                   "speculative_num_draft_tokens")] == ["3", "4", "8"]
    # SGLang's documented tree (steps 3, topk 4, N 16) fits its candidate pool (4 + 2 x 16 = 36);
    # topk x steps + 1 = 13 used to refuse it.
    big = apply_settings(Launch(BASE), {"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 16})
    assert get_arg(list(big.argv), "speculative_num_draft_tokens") == "16"


@pytest.mark.parametrize("changes, words", [
    ({"speculative_num_steps": 3, "speculative_num_draft_tokens": 7}, "steps \\+ 1 = 4"),
    ({"speculative_eagle_topk": 4}, "give speculative_num_draft_tokens"),
    ({"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 12}, "at most topk \\+ \\(steps - 1\\) x topk\\^2 \\+ 1 = 11"),
    ({"speculative_num_steps": 0}, ">= 1"),
    ({"speculative_num_steps": "three"}, "whole number"),
    ({"speculative_draft_placement": "replicated"}, "no draft placement 'replicated'"),
    ({"attn_dp_size": 3}, "must divide tp_size=8"),
    ({"max_running_requests": 8}, "cannot relaunch SGLang with max_running_requests"),
    ({"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "yes"}, "must be 0 or 1"),
])
def test_settings_sglang_would_refuse_are_refused_up_front(changes, words):
    with pytest.raises(ArgsError, match=words):
        apply_settings(Launch(BASE), changes)


def test_runs_already_reads_values_not_flag_order():
    base = Launch(BASE)
    assert runs_already(base, {"speculative_num_steps": 3}) and runs_already(base, {"speculative_eagle_topk": 1})
    assert apply_settings(base, {"speculative_num_steps": 3}) != base          # reordered: not a change
    assert not runs_already(base, {"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4})
    assert runs_already(base, {"speculative_draft_placement": "sharded"})
    assert not runs_already(base, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": 0})   # left to SGLang: say it
    pcie = apply_settings(base, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": 1})
    assert runs_already(pcie, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": 1})
    assert not runs_already(base, {"speculative_num_steps": 0})              # refused: not "already"


def test_env_and_attention_dp_settings():
    got = apply_settings(Launch(BASE), {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": 1, "attn_dp_size": 8})
    assert got.env_dict() == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert get_arg(list(got.argv), "attn_dp_size") == "8"
    back = apply_settings(got, {"speculative_draft_placement": "sharded",
                                "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": 0})
    assert get_arg(list(back.argv), "attn_dp_size") is None and back.env_dict()[
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "0"
    assert back.display().startswith("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0 python -m sglang.launch_server")


def test_display_is_exact_and_hides_secrets():
    launch = Launch(BASE + ("--api-key", "s3cret", "--admin-api-key=adm", "--model-path", "a b"))
    shown = launch.display()
    assert "s3cret" not in shown and "adm" not in shown.replace("admin", "")
    assert "--api-key <redacted>" in shown and "--admin-api-key=<redacted>" in shown
    assert "'a b'" in shown


def test_server_url_and_command_checks():
    assert server_url(list(BASE)) == "http://127.0.0.1:30000"
    assert server_url(["x", "--host", "0.0.0.0", "--port=8001"]) == "http://127.0.0.1:8001"
    assert server_url(["x", "--host", "::1", "--port", "9"]) == "http://[::1]:9"
    with pytest.raises(ArgsError):
        check_command([])
    with pytest.raises(ArgsError, match="separate words"):
        check_command(["python -m sglang.launch_server --port 1"])


def test_adaptive_launch_needs_a_captured_step(tmp_path):
    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 2, 3]}}))
    argv = BASE + ("--speculative-adaptive", "--speculative-adaptive-config", str(cfg))
    assert adaptive_candidates(list(argv)) == [1, 2, 3]
    with pytest.raises(ArgsError, match="captures steps \\[1, 2, 3\\]"):
        apply_settings(Launch(argv), {"speculative_num_steps": 5})
    assert get_arg(list(apply_settings(Launch(argv), {"speculative_num_steps": 2}).argv),
                   "speculative_num_steps") == "2"
    with pytest.raises(ArgsError, match="need topk 1"):
        apply_settings(Launch(argv), {"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 5})


def test_pinning_launch(tmp_path):
    assert pinning_config([3, 1, 2, 2]) == {"warmup_batches": 1_000_000_000,
                                            "1": {"candidate_steps": [1, 2, 3]}}
    launch, cfg = with_pinning(Launch(BASE), [1, 2, 3, 4, 5], tmp_path / "pin.json")
    argv = list(launch.argv)
    assert get_arg(argv, "speculative_adaptive") is True
    assert get_arg(argv, "speculative_adaptive_config") == str(tmp_path / "pin.json")
    assert get_arg(argv, "speculative_num_steps") == "3"           # the launch's own, a candidate
    assert get_arg(argv, "speculative_num_draft_tokens") == "4"
    tree = Launch(set_arg(list(BASE), "speculative_eagle_topk", 4))
    with pytest.raises(ArgsError, match="topk 1"):
        with_pinning(tree, [1, 2], tmp_path / "x.json")


# --- the owned process --------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie we do not own counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def _standin(tmp_path, port, *extra) -> Launch:
    return Launch((sys.executable, str(STANDIN), "--port", str(port), "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                   "--standin-child-pidfile", str(tmp_path / "child.pid"), *extra))


@pytest.fixture
def managed(tmp_path):
    events: list[tuple[str, dict]] = []
    progress: list[str] = []
    server = ManagedServer(_standin(tmp_path, free_port()), tmp_path / "server.log",
                           ready_timeout_s=30, poll_s=0.05,
                           on_event=lambda k, d: events.append((k, d)), on_progress=progress.append)
    server.events, server.progress_lines = events, progress
    yield server
    server.stop(grace_s=5)


def _info(server) -> dict:
    return httpx.get(server.url + "/server_info", timeout=5, trust_env=False).json()


def test_start_waits_for_readiness_and_stop_ends_the_whole_tree(managed, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_STARTUP_S", "1.0")
    managed.start()
    log = (tmp_path / "server.log").read_text()              # what /health answered before start returned
    assert "/health 503 starting" in log and "/health 200" in log
    assert log.index("/health 503") < log.index("/health 200")
    assert _info(managed)["speculative_num_steps"] == 3
    assert any("[stand-in]" in p for p in managed.progress_lines)     # the log's newest line
    child = int((tmp_path / "child.pid").read_text())
    leader = managed.proc.pid
    assert _alive(child)
    managed.stop(grace_s=5)
    assert not _alive(leader) and not _alive(child)
    assert managed.tried[-1].outcome == "stopped"


def test_relaunch_applies_settings_and_marks_events(managed):
    managed.start()
    first = managed.proc.pid
    assert managed.relaunch({"speculative_num_steps": 5, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": 1}) is True
    info = _info(managed)
    assert managed.proc.pid != first and not _alive(first)
    assert info["speculative_num_steps"] == 5 and info["speculative_num_draft_tokens"] == 6
    assert info["env:SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert "--speculative-num-steps 5" in info["launch_command"]
    assert [k for k, _ in managed.events] == ["relaunch_started", "relaunch_ready"]
    assert managed.events[0][1]["command"] == managed.launch.display()
    report = managed.report()
    assert "--speculative-num-steps 3" in report and "--speculative-num-steps 5" in report
    assert [t.outcome for t in managed.tried] == ["stopped", "ready"]


def test_declined_relaunch_changes_nothing(managed):
    managed.start()
    pid = managed.proc.pid
    managed.confirm = lambda q: "speculative_eagle_topk=4" in q and False
    assert managed.relaunch({"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}) is False
    assert managed.proc.pid == pid and managed.events == []


def test_refused_setting_rolls_back_to_the_previous_command(managed, monkeypatch):
    monkeypatch.setenv("STANDIN_REFUSE", "speculative_eagle_topk=4")
    managed.start()
    with pytest.raises(LaunchError, match="rolled back"):
        managed.relaunch({"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8})
    assert managed.alive() and _info(managed)["speculative_eagle_topk"] == 1
    assert [k for k, _ in managed.events] == ["relaunch_started", "relaunch_failed",
                                             "relaunch_rolled_back"]
    assert "exited with status 1" in managed.events[1][1]["error"]
    outcomes = [t.outcome for t in managed.tried]
    assert outcomes[0] == "stopped" and outcomes[1].startswith("failed: the server exited")
    assert outcomes[2] == "ready"


def test_startup_failure_and_timeout_say_why_with_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_REFUSE", "speculative_num_steps=3")
    s = ManagedServer(_standin(tmp_path, free_port()), tmp_path / "a.log", poll_s=0.05)
    with pytest.raises(LaunchError, match="exited with status 1") as e:
        s.start()
    assert "stand-in refuses" in str(e.value) and not s.alive()
    monkeypatch.delenv("STANDIN_REFUSE")
    monkeypatch.setenv("STANDIN_STARTUP_S", "60")
    s = ManagedServer(_standin(tmp_path, free_port()), tmp_path / "b.log", poll_s=0.05,
                      ready_timeout_s=3)
    with pytest.raises(LaunchError, match="not ready within 3 s"):
        s.start()
    assert not s.alive()
    pidfile = tmp_path / "child.pid"      # absent if the loaded machine never got that far
    assert not pidfile.exists() or not _alive(int(pidfile.read_text()))
    s = ManagedServer(Launch(("/nonexistent/sglang-binary",)), tmp_path / "c.log")
    with pytest.raises(LaunchError, match="cannot start"):
        s.start()


def test_readiness_with_an_api_key(tmp_path):
    port = free_port()
    s = ManagedServer(_standin(tmp_path, port, "--api-key", "k1"), tmp_path / "s.log", poll_s=0.05,
                      ready_timeout_s=20, api_key="k1")
    try:
        s.start()
        assert "k1" not in s.tried[0].command
    finally:
        s.stop(grace_s=5)


def _cli(tmp_path, *args, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tuner", "launch", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def test_cli_tries_each_setting_prints_every_command_and_leaves_nothing(tmp_path):
    port = free_port()
    out = _cli(tmp_path, "--no-tui", "--yes", "--log", str(tmp_path / "server.log"),
               "--try", "speculative_num_steps=2", "--try", "speculative_eagle_topk=2,speculative_num_draft_tokens=5",
               "--", *_standin(tmp_path, port).argv)
    assert out.returncode == 0, out.stderr[-3000:]
    err = out.stderr
    assert err.count("event relaunch_started") == 2 and err.count("event relaunch_ready") == 2
    tail = err[err.index("Launch commands tried"):]
    assert "1. stopped" in tail and "2. stopped" in tail and "3. stopped" in tail
    for steps in ("3", "2"):
        assert f"--speculative-num-steps {steps}" in tail
    assert "--speculative-eagle-topk 2 --speculative-num-draft-tokens 5" in tail
    assert not _alive(int((tmp_path / "child.pid").read_text()))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False)


def test_cli_refuses_without_yes_off_a_terminal_and_bad_input(tmp_path):
    port = free_port()
    out = _cli(tmp_path, "--no-tui", "--try", "speculative_num_steps=2",
               "--", *_standin(tmp_path, port).argv)
    assert out.returncode == 0 and "pass --yes" in out.stderr and "declined" in out.stderr
    assert _cli(tmp_path, "--no-tui").returncode == 2
    bad = _cli(tmp_path, "--no-tui", "--try", "steps", "--", "python")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    bad = _cli(tmp_path, "--no-tui", "--record", str(tmp_path / "r.db"), "--", "python")
    assert bad.returncode == 2 and "--record records the TUI's session" in bad.stderr
    assert _cli(tmp_path, "--load", "-1", "--", "python").stderr.strip().endswith("--load must be 0 or more")


@pytest.mark.slow
def test_relaunch_the_reference_engine(tmp_path):
    """A real engine child: `python -m refengine serve` on CPU, relaunched with other steps."""
    port = free_port()
    launch = Launch((sys.executable, "-m", "refengine", "serve", "--device", "cpu", "--tp-size", "1",
                     "--load-format", "dummy",
                     "--host", "127.0.0.1", "--port", str(port), "--skip-server-warmup",
                     "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", "3"))
    s = ManagedServer(launch, tmp_path / "engine.log", ready_timeout_s=180, poll_s=0.2)
    try:
        s.start()
        assert _info(s)["speculative_num_steps"] == 2
        assert s.relaunch({"speculative_num_steps": 3})
        info = _info(s)
        assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4
    finally:
        s.stop(grace_s=15)
    assert not s.alive()


def test_after_shutdown_nothing_starts_again(managed):
    """A relaunch on the TUI's worker thread may still be running when launch exits: once shut
    down, the manager starts nothing (the new command nor the rollback)."""
    managed.start()
    pid = managed.proc.pid
    managed.shutdown(grace_s=5)
    assert not _alive(pid) and managed.proc is None
    with pytest.raises(LaunchError, match="shutting down"):
        managed.relaunch({"speculative_num_steps": 5}, confirmed=True)
    assert managed.proc is None
    assert [k for k, _ in managed.events] == ["relaunch_started", "relaunch_failed"]


def test_proposal_and_question_change_nothing(managed):
    managed.start()
    pid = managed.proc.pid
    new = managed.proposal({"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4})
    assert "--speculative-eagle-topk 2 --speculative-num-draft-tokens 4" in new.display()
    assert new.display() in managed.question({"speculative_eagle_topk": 2}, new)
    assert managed.proposal({"speculative_num_steps": 3}) is None          # runs it already
    with pytest.raises(ArgsError, match="exceeds the tree"):
        managed.proposal({"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 40})
    assert managed.proc.pid == pid and managed.events == [] and len(managed.tried) == 1
