"""The package builds without a warning and ships its data.

`make` installs the checkout editable, and pip shows every warning the build backend raises: a fresh
set-up must print none ("Package would be ignored" for the model's data folders, the flat-layout
"Please be careful with folders ... same name as your package", a deprecated license table). Both
builds run setuptools' own backend on a copy of the tracked packaging files, in a fresh interpreter:
nothing is written into the checkout and nothing is downloaded. The wheel must hold every tracked
file of the three packages (the tiny model, the TUI's stylesheet), and the data must be found from
the unpacked wheel with the checkout out of sight.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tuner", "probes", "refengine")

# Runs the PEP 517 hook in a fresh interpreter with every warning recorded, not printed.
BUILD = """
import json, sys, warnings
from setuptools import build_meta
hook, out = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = getattr(build_meta, hook)(out)
with open(out + "/result.json", "w") as f:
    json.dump({"wheel": name, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}, f)
"""

FIND_DATA = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import tuner
from refengine.data import TINY_DRAFT_DIR, TINY_PROMPTS, TINY_TARGET_DIR
paths = [TINY_TARGET_DIR / "model.safetensors", TINY_TARGET_DIR / "tokenizer.json", TINY_DRAFT_DIR / "model.safetensors",
         TINY_PROMPTS, Path(tuner.__file__).parent / "app.tcss"]
print(json.dumps([[str(p), p.is_file()] for p in paths]))
"""


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--", "pyproject.toml", "README.md", *PACKAGES],
                         cwd=ROOT, capture_output=True, check=True).stdout.decode()
    return [p for p in out.split("\0") if p]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, list[str]]:
    """A copy of what the build reads, so the build's egg-info and build/ land outside the checkout."""
    src = tmp_path_factory.mktemp("src")
    files = _tracked()
    for rel in files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, src / rel)
    return src, files


def _build(src: Path, hook: str, out: Path) -> tuple[Path, list[str]]:
    out.mkdir()
    ran = subprocess.run([sys.executable, "-c", BUILD, hook, str(out)], cwd=src, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, f"{hook} failed: {ran.stderr[-2000:]}"
    result = json.loads((out / "result.json").read_text())
    return out / result["wheel"], result["warnings"]


def test_the_editable_install_make_runs_warns_of_nothing(source, tmp_path):
    src, _ = source
    wheel, warned = _build(src, "build_editable", tmp_path / "out")
    assert warned == []
    with zipfile.ZipFile(wheel) as z:
        pth = [n for n in z.namelist() if n.endswith(".pth")]
        assert len(pth) == 1, z.namelist()
        # The checkout itself goes on sys.path: the packages and their data are imported in place.
        assert z.read(pth[0]).decode().split() == [str(src.resolve())]


def test_the_wheel_warns_of_nothing_and_ships_every_package_file(source, tmp_path):
    src, files = source
    wheel, warned = _build(src, "build_wheel", tmp_path / "out")
    assert warned == []
    with zipfile.ZipFile(wheel) as z:
        shipped = set(z.namelist())
        z.extractall(tmp_path / "site")
    missing = [f for f in files if f.startswith(tuple(p + "/" for p in PACKAGES)) and f not in shipped]
    assert missing == []
    # From the unpacked wheel alone (-I -S: no checkout, no site-packages): the default model's files,
    # the prompts and the TUI's stylesheet are where the code looks for them.
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", FIND_DATA, str(tmp_path / "site")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert all(path.startswith(str(tmp_path / "site")) and ok for path, ok in found), found
