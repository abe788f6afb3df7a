"""The plugin loads under SGLang 0.5.23's own `load_plugins()`, from our distribution's entry point.

Runs in a fresh interpreter with the wheel (installed without dependencies) on sys.path. The
first test records whether SGLang's top-level package imports here at all; the plugin framework
is then imported for real with the top-level initializer skipped (see sglang_wheel_code).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probes.inserver import sglang_plugin
from sglang_wheel_code import plugin_framework_env

ROOT = Path(__file__).resolve().parents[2]

LOAD = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from sglang.srt.plugins import load_plugins, GENERAL_PLUGINS_GROUP
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
load_plugins()          # idempotent: must not register twice
print(json.dumps({
    "group": GENERAL_PLUGINS_GROUP,
    "sglang_file": sys.modules["sglang.srt.plugins"].__file__,
    "hooks": {t: [[ht.value, getattr(h, "__name__", ""), src.plugin_name if src else None,
                   src.dist_name if src else None] for ht, h, src in hs]
              for t, hs in HookRegistry._hooks.items()},
}))
"""


def _run(target: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SPECDECODE_"))}
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT)])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=e)


def _load(target: Path, **env: str) -> dict:
    out = _run(target, plugin_framework_env(target) + LOAD, **env)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        if "sglang" in out.stderr and ("ImportError" in last or "ModuleNotFoundError" in last):
            pytest.skip(f"SGLang's plugin module cannot import here: {last}")
        pytest.fail(out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = out.stderr
    return result


def test_top_level_sglang_import_is_reported(sglang_target):
    """Records (never hides) why the full `import sglang` is not used by these tests."""
    out = _run(sglang_target, "import sglang.srt.plugins")
    if out.returncode == 0:
        return
    last = out.stderr.strip().splitlines()[-1]
    # Only missing runtime dependencies are acceptable; anything else is a real breakage.
    assert "ModuleNotFoundError" in last or "ImportError" in last, out.stderr[-2000:]


@pytest.mark.parametrize("role, expected", [
    ("scheduler", sglang_plugin.SCHEDULER_HOOKS),
    ("main", sglang_plugin.MAIN_HOOKS),
    ("other", ()),
])
def test_load_plugins_registers_our_hooks(sglang_target, role, expected):
    r = _load(sglang_target, SPECDECODE_PLUGIN_ROLE=role)
    assert r["group"] == "sglang.srt.plugins"
    assert r["sglang_file"].startswith(str(sglang_target))
    assert "Executed general plugin: specdecode" in r["log"]
    ours = {t: hs for t, hs in r["hooks"].items()
            if any(h[2] == "specdecode" for h in hs)}
    assert set(ours) == {sglang_plugin.TARGETS[n] for n in expected}
    for target, hooks in ours.items():
        assert len(hooks) == 1, f"{target} registered twice"
        hook_type, _name, plugin, dist = hooks[0]
        assert (hook_type, plugin, dist) == ("around", "specdecode", "specdecode-tune")


def test_sglang_plugins_whitelist_can_exclude_us(sglang_target):
    r = _load(sglang_target, SPECDECODE_PLUGIN_ROLE="scheduler", SGLANG_PLUGINS="someone_else")
    assert not any(h[2] == "specdecode" for hs in r["hooks"].values() for h in hs)
    assert "Skipping plugin specdecode (not in SGLANG_PLUGINS)" in r["log"]


def test_whitelist_naming_us_loads_us(sglang_target):
    r = _load(sglang_target, SPECDECODE_PLUGIN_ROLE="main", SGLANG_PLUGINS="specdecode")
    assert sglang_plugin.TARGETS["http_routes"] in r["hooks"]


def test_role_is_guessed_from_sglangs_call_stack(sglang_target):
    """register() called from a function named like SGLang's scheduler entry registers the
    scheduler hooks; from anywhere else only the HTTP-process hook."""
    code = plugin_framework_env(sglang_target) + r"""
import json
from probes.inserver import sglang_plugin
def run_scheduler_process():
    return sglang_plugin.process_role()
def run_detokenizer_process():
    return sglang_plugin.process_role()
print(json.dumps([run_scheduler_process(), run_detokenizer_process(), sglang_plugin.process_role()]))
"""
    out = _run(sglang_target, code)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["scheduler", "other", "main"]
