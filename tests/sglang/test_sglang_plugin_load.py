"""The plugin loads under SGLang 0.5.23's own `load_plugins()`, from our distribution's entry point.

Runs in a fresh interpreter with the wheel (installed without dependencies) on sys.path. The
first test records whether SGLang's top-level package imports here at all; the plugin framework
is then imported for real with the top-level initializer skipped (see sglang_wheel_code). The
launch tests run SGLang's own `launch_server` (sglang_http_launch) with metrics off: no
--enable-metrics, no PROMETHEUS_MULTIPROC_DIR; its scheduler is a real child process.
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
HERE = Path(__file__).resolve().parent

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
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SGLANG_", "SPECDECODE_", "PROMETHEUS_MULTIPROC_DIR"))}
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT), str(HERE)])
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
    assert sglang_plugin.TARGETS["http_launch"] in r["hooks"]


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


# A scheduler rank as SGLang starts it: a child process whose entry function loads the plugins,
# then (on the first timed iteration) opens its stream where the plugin says.
SCHEDULER = r"""
import json, os
from types import SimpleNamespace
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from probes.inserver import sglang_plugin

def run_scheduler_process():
    load_plugins()
    sglang_plugin._probe.start(SimpleNamespace(device="cpu"))
    w = sglang_plugin._probe.writer          # None when the rank found no stream directory
    if w is not None:
        w.write([{"seq": s, "wall_ms": 1.5, "bs": 2} for s in (1, 2, 3)])
    print(json.dumps({
        "stream_dir": os.environ.get("SPECDECODE_STREAM_DIR"),
        "prometheus": os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
        "writer": str(w.path) if w is not None else None,
        "hooks": sorted(t for t, hs in HookRegistry._hooks.items()
                        if any(src and src.plugin_name == "specdecode" for _, _, src in hs)),
    }))

run_scheduler_process()
"""

# An extra HTTP worker (--tokenizer-worker-num > 1) as SGLang starts it: a fresh process that
# loads no plugins and imports the app path from its environment, as uvicorn does
# (module:attribute). SGLang's http_server cannot import here, so its stand-in is registered first.
WORKER = r"""
import importlib, json, os, sys
from pathlib import Path
from starlette.testclient import TestClient
from sglang_http_launch import build

build(Path(sys.modules["sglang"].__path__[0]), lambda: None, lambda app: None)
path = os.environ.get("SGLANG_HTTP_SERVER_APP_PATH", "sglang.srt.entrypoints.http_server:app")
module, attr = path.split(":")
app = getattr(importlib.import_module(module), attr)
with TestClient(app) as client:
    r = client.get("/specdecode/phases", params={"after": 1})
    print(json.dumps({"app_path": path, "plugins_loaded": "sglang.srt.plugins" in sys.modules,
                      "same_app": app is sys.modules["sglang.srt.entrypoints.http_server"].app,
                      "phases": [r.status_code, r.json() if r.status_code == 200 else None]}))
"""

LAUNCH = r"""
import json, logging, os, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from starlette.testclient import TestClient
from sglang_http_launch import build

SCHEDULER_CODE, WORKER_CODE = sys.argv[1], sys.argv[2]
seen = {"env_before_launch": os.environ.get("SPECDECODE_STREAM_DIR")}

def start_schedulers():
    out = subprocess.run([sys.executable, "-c", SCHEDULER_CODE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen["scheduler"] = json.loads(out.stdout.strip().splitlines()[-1])

def serve(app):
    seen["routes"] = [r.path for r in app.router.routes]
    with TestClient(app) as client:
        seen["streams"] = client.get("/specdecode/streams").json()
        r = client.get("/specdecode/phases", params={"after": 1})
        seen["phases"] = [r.status_code, r.json()]
    out = subprocess.run([sys.executable, "-c", WORKER_CODE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen["worker"] = json.loads(out.stdout.strip().splitlines()[-1])

http = build(Path(sys.modules["sglang"].__path__[0]), start_schedulers, serve)
from sglang.srt.plugins import load_plugins
load_plugins()
http.launch_server(SimpleNamespace(enable_metrics=False))     # SGLang's launch, now hooked
seen["launch_wrapped"] = hasattr(http.launch_server, "__wrapped__")
print(json.dumps(seen))
"""


def _launch(target: Path, extra_path: Path | None = None, **env: str) -> dict:
    code = plugin_framework_env(target) + LAUNCH
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SGLANG_", "SPECDECODE_", "PROMETHEUS_MULTIPROC_DIR"))}
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT), str(HERE)]
                                      + ([str(extra_path)] if extra_path else []))
    out = subprocess.run([sys.executable, "-c", code, plugin_framework_env(target) + SCHEDULER,
                          plugin_framework_env(target) + WORKER],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=e)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = out.stderr
    return result


def test_routes_and_stream_without_enable_metrics(sglang_target):
    """Metrics off: the launch hook picks the stream directory before SGLang starts the scheduler
    (which inherits it), and SGLang's app answers /specdecode/* with that scheduler's records."""
    r = _launch(sglang_target)
    assert r["launch_wrapped"] and r["env_before_launch"] is None
    sched = r["scheduler"]
    assert sched["prometheus"] is None
    d = Path(sched["stream_dir"])
    assert d.name.startswith("specdecode-phases-")
    assert sched["writer"] == str(d / "specdecode-phases-dp0-tp0.jsonl")
    assert set(sched["hooks"]) == {sglang_plugin.TARGETS[n] for n in sglang_plugin.SCHEDULER_HOOKS}
    assert r["routes"][-2:] == ["/specdecode/phases", "/specdecode/streams"]
    assert r["streams"] == {"plugin": "specdecode", "version": sglang_plugin.PLUGIN_VERSION,
                            "streams": [{"dp": 0, "rank": 0}]}
    status, body = r["phases"]
    assert status == 200 and [x["seq"] for x in body["records"]] == [2, 3] and body["next"] == 3
    assert f"phase stream in {d} (made for this launch)" in r["log"]
    # --tokenizer-worker-num > 1: a worker that loads no plugins serves the routes too, over the
    # same stream.
    w = r["worker"]
    assert w["app_path"] == sglang_plugin.WORKER_APP and not w["plugins_loaded"] and w["same_app"]
    assert w["phases"] == [200, body]
    assert not d.exists(), "the launching process removes the directory it made when it exits"


def test_an_app_path_the_user_set_is_kept(sglang_target, tmp_path):
    """Then SGLang's extra HTTP workers serve the user's app, without our routes."""
    (tmp_path / "user_app.py").write_text(
        "from sglang.srt.entrypoints.http_server import app as wrapped\n")
    r = _launch(sglang_target, extra_path=tmp_path, SGLANG_HTTP_SERVER_APP_PATH="user_app:wrapped")
    assert r["routes"][-2:] == ["/specdecode/phases", "/specdecode/streams"]   # one worker: ours
    w = r["worker"]
    assert w["app_path"] == "user_app:wrapped" and w["same_app"] and w["phases"] == [404, None]
    assert "SGLANG_HTTP_SERVER_APP_PATH=user_app:wrapped is yours" in r["log"]


def test_a_stream_dir_the_user_set_is_kept(sglang_target, tmp_path):
    r = _launch(sglang_target, SPECDECODE_STREAM_DIR=str(tmp_path))
    assert r["scheduler"]["stream_dir"] == str(tmp_path)
    assert r["phases"][0] == 200 and len(r["phases"][1]["records"]) == 2
    assert (tmp_path / "specdecode-phases-dp0-tp0.jsonl").exists()      # not removed at exit
