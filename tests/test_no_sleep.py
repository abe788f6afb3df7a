"""Tests wait on conditions, never on the clock: no `time.sleep` (or `asyncio.sleep`, or a Textual
pilot's `pause(delay)`, which is an asyncio sleep) in tests/ outside the short allowlist below, where a
sleep is the behaviour being simulated or a pace, not a way to let something else happen first.
Waiting goes through `harness.wait_until` (`tui/helpers.wait_for` in a pilot). A bare `pilot.pause()`
(let pending messages run) is not a sleep."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# (file under tests/, enclosing function) -> why a sleep is right there.
ALLOWED = {
    ("harness.py", "wait_until"): "the one poll interval between two looks at the condition",
    ("probes/test_capture.py", "_export"): "the stand-in profiler writes a trace slowly, as a real exporter "
                                           "does, so a reader that trusts a file's existence alone is caught",
    ("tui/make_fixture.py", "record"): "a script, not a test: it records the real engine at the TUI's 10 Hz tick",
    ("hostile/conftest.py", "_peak_rss_mb"): "the pace of sampling a child's memory while it runs",
    ("tui/helpers.py", "wait_for"): "the pilot's poll interval between two looks at the condition",
}


def _sleeps(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every sleep call in one file."""
    tree = ast.parse(path.read_text(), str(path))
    # `from time import sleep` / `from asyncio import sleep`: a bare `sleep(...)` counts too.
    bare = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            and n.module in ("time", "asyncio") for a in n.names if a.name == "sleep"}
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                f = child.func
                if (isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name)
                        and f.value.id in ("time", "asyncio")) or (isinstance(f, ast.Name) and f.id in bare):
                    found.append((func, child.lineno))
                elif isinstance(f, ast.Attribute) and f.attr == "pause" and (child.args or child.keywords):
                    found.append((func, child.lineno))   # pilot.pause(delay): asyncio.sleep(delay)
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_no_sleep_outside_the_allowlist():
    offenders = []
    used = set()
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS).as_posix()
        for func, line in _sleeps(path):
            if (rel, func) in ALLOWED:
                used.add((rel, func))
            else:
                offenders.append(f"tests/{rel}:{line} in {func}()")
    assert offenders == [], "sleeps used to wait; wait on a condition (harness.wait_until): " + ", ".join(offenders)
    assert used == set(ALLOWED), f"allowlist entries with no sleep left: {sorted(set(ALLOWED) - used)}"


def test_the_scan_sees_every_spelling(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("import time, asyncio\nfrom time import sleep as nap\n"
                 "def a():\n    time.sleep(1)\n"
                 "async def b():\n    await asyncio.sleep(1)\n"
                 "def c():\n    nap(1)\n"
                 "async def d(pilot):\n    await pilot.pause()\n    await pilot.pause(1.0)\n    await pilot.pause(delay=1)\n"
                 "CHILD = 'time.sleep(600)'  # inside a child's source: not this process waiting\n")
    assert _sleeps(f) == [("a", 4), ("b", 6), ("c", 8), ("d", 11), ("d", 12)]
