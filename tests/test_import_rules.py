"""The import rules of docs/ARCHITECTURE.md, checked two ways: import-linter's contracts, and a
fresh interpreter that imports every headless module and must not have loaded textual or torch."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules allowed to import textual (the TUI's face); everything else in tuner/ is headless.
TEXTUAL_MODULES = ("tuner.app", "tuner.actions", "tuner.widgets", "tuner.screens", "tuner.messages")

PROBE = r"""
import importlib, json, pkgutil, sys
import tuner, probes
skip = tuple(sys.argv[1].split(","))
loaded = []
for pkg in (tuner, probes):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        name = info.name
        if name.startswith(skip) or name.startswith("probes.inserver") or name.endswith("__main__"):
            continue
        importlib.import_module(name)
        loaded.append(name)
print(json.dumps({"loaded": loaded,
                  "textual": [m for m in sys.modules if m.split(".")[0] in ("textual", "textual_plotext")],
                  "torch": [m for m in sys.modules if m.split(".")[0] == "torch"]}))
"""


def test_headless_modules_load_neither_textual_nor_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(TEXTUAL_MODULES)],
        cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "tuner.cli" in result["loaded"]
    assert result["textual"] == [], f"headless import pulled in textual: {result['textual'][:5]}"
    assert result["torch"] == [], f"headless import pulled in torch: {result['torch'][:5]}"


def test_import_linter_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_the_independence_contract_lists_every_command():
    """A new command joins the contract that keeps the commands siblings (pyproject.toml)."""
    import tomllib

    from tuner.cli import COMMANDS

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [siblings] = [c for c in contracts if c["type"] == "independence" and "tuner.commands.tune" in c["modules"]]
    assert sorted(siblings["modules"]) == sorted(f"tuner.commands.{module}" for module, _ in COMMANDS.values())


def test_the_commands_that_open_a_session_stay_short():
    # They are siblings over tuner.commands.options' opener: a command that grows past this is doing
    # work that belongs in a module of its own (the review's bound; app.py has its own, 400).
    sizes = {name: len((ROOT / "tuner" / "commands" / f"{name}.py").read_text().splitlines())
             for name in ("attach", "record", "tune", "once")}
    assert all(n <= 150 for n in sizes.values()), sizes
    assert len((ROOT / "tuner" / "app.py").read_text().splitlines()) <= 400
