"""End to end in a real terminal: `specdecode-tune demo` in tmux, keys pressed as a person would,
the pane read back as text, and nothing left running after `q`.

Needs tmux (skipped without it). The demo starts the real engine (TP 2 on CPU) and the load driver.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

ROOT = Path(__file__).resolve().parents[2]


class Pane:
    """One tmux server on its own socket with one 120x40 window."""

    def __init__(self, command: str) -> None:
        # A short socket path: unix sockets are limited to ~100 bytes.
        self.dir = tempfile.mkdtemp(prefix="sdt-")
        self.socket = os.path.join(self.dir, "s")
        self.tmux("new-session", "-d", "-s", "e2e", "-x", "120", "-y", "40", command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True,
                              check=True).stdout

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "e2e")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "e2e", *keys)

    def pid(self) -> int:
        return int(self.tmux("display-message", "-p", "-t", "e2e", "#{pane_pid}").strip())

    def wait(self, pattern: str, timeout: float, why: str) -> re.Match:
        try:
            return wait_until(lambda: re.search(pattern, self.text()), timeout, why, interval=0.5)
        except AssertionError:
            raise AssertionError(f"{why}: no /{pattern}/ within {timeout:.0f} s; the pane shows:\n{self.text()}") from None

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def descendants(root: int) -> set[int]:
    """Every live process below `root` (by /proc parent links)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ").strip()
    except OSError:
        return "?"


def test_demo_in_tmux_as_a_person_uses_it():
    # The terminal's own size: a COLUMNS/LINES left in the environment (pytest plugins set them for
    # their own consoles) would override the pane's.
    env = f"-u COLUMNS -u LINES PYTHONPATH={ROOT} OMP_NUM_THREADS=1"
    pane = Pane(f"cd {ROOT} && env {env} {sys.executable} -m tuner demo --load 2; echo DEMO-EXIT=$?; sleep 600")
    try:
        screen = pane.wait(r"● connected", 240, "the demo opens the TUI connected to its engine")
        assert screen
        pane.wait(r"server\s+[1-9]\d*\.\d", 120, "tok/s moves under the demo's load")
        text = pane.text()
        for panel in ("tok/s", "acceptance", "decode iteration", "knobs", "A/B", "events", "GPUs"):
            assert panel in text, f"panel {panel!r} missing:\n{text}"
        assert "load started: 2 concurrent" in text
        before = int(pane.wait(r"active steps (\d+)", 10, "the active setting in the header").group(1))
        children = descendants(pane.pid())
        assert any("refengine" in open(f"/proc/{p}/cmdline").read() for p in children if alive(p))

        pane.keys("+")
        pane.wait(rf"active steps {before + 1} ", 60, "+ raises steps and the server confirms it")
        pane.wait(rf"now running steps {before}→{before + 1}", 30, "the change in the event log")
        pane.keys("p")
        pane.wait(r"active steps \d+ · topk \d+ · draft \d+ · replicated", 60, "p moves the draft")
        pane.wait(r"after placement sharded→replicated", 30, "the A/B readout follows the last change")
        pane.keys("?")
        pane.wait(r"help · esc to close", 10, "? opens the help")
        pane.keys("Escape")
        # A terminal cannot tell Esc from the start of an escape sequence at once: wait for the
        # screen to close before the next key, or Esc + q would read as alt+q.
        wait_until(lambda: "help · esc to close" not in pane.text(), 10, "esc to close the help", interval=0.3)
        children = {p for p in descendants(pane.pid()) if alive(p)}

        pane.keys("q")
        pane.wait(r"DEMO-EXIT=0", 60, "q quits the demo cleanly")
        try:
            wait_until(lambda: not any(alive(p) for p in children - {pane.pid()}), 20, "the demo's children to end")
        except AssertionError:
            pass   # the assertion below names what was left
        left = [p for p in children if alive(p) and p != pane.pid()
                and "sleep" not in open(f"/proc/{p}/cmdline").read()]
        assert left == [], f"the demo left processes behind: {left}"
    finally:
        pane.close()


def test_closing_the_terminal_takes_the_engine_with_it():
    """The terminal goes away (SIGHUP to the demo): the engine and its ranks must not be left behind."""
    env = f"-u COLUMNS -u LINES PYTHONPATH={ROOT} OMP_NUM_THREADS=1"
    pane = Pane(f"cd {ROOT} && exec env {env} {sys.executable} -m tuner demo --load 1")
    try:
        pane.wait(r"● connected", 240, "the demo opens the TUI connected to its engine")
        everything = {p for p in descendants(pane.pid()) if alive(p)} | {pane.pid()}
        assert any("refengine" in open(f"/proc/{p}/cmdline").read() for p in everything if alive(p))
    finally:
        pane.close()                    # kills the tmux server: the demo's terminal hangs up
    try:
        wait_until(lambda: not any(alive(p) for p in everything), 30, "every process to end")
    except AssertionError:
        pass   # the assertion below names what was left
    left = {p: _cmdline(p) for p in everything if alive(p)}
    assert left == {}, f"processes outlived their terminal: {left}\n{_stacks(left)}"


def _stacks(pids) -> str:
    """Where each left-behind Python process stands (py-spy, a dependency), for the failure message."""
    out = []
    beside = Path(sys.executable).parent / "py-spy"
    exe = str(beside) if beside.exists() else "py-spy"
    for pid in pids:
        try:
            r = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            out.append(f"--- {pid}\n{(r.stdout or r.stderr)[-3000:]}")
        except (OSError, subprocess.SubprocessError) as e:
            out.append(f"--- {pid}: py-spy: {e}")
    return "\n".join(out)
