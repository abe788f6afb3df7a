"""The set-up line says which torch build it installs, and TORCH_INDEX reaches pip only when set.

`make -n` (nothing is run, nothing written) on the real Makefile: stock PyPI's torch 2.13.0 on
Linux is the CUDA build, so the line must not promise a CPU build it does not ask for.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(*args: str) -> list[str]:
    out = subprocess.run(["make", "-n", "-B", ".venv/bin/specdecode-tune", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.splitlines()


def test_without_torch_index_pip_asks_pypi_and_the_line_says_cuda():
    lines = dry_run()
    torch = next(line for line in lines if "torch==2.13.0" in line)
    assert "--extra-index-url" not in torch and "--index-url" not in torch
    said = next(line for line in lines if line.startswith("echo "))
    assert "from PyPI (on Linux the CUDA build" in said and "TORCH_INDEX=" in said


def test_torch_index_becomes_an_extra_index():
    url = "https://download.pytorch.org/whl/cpu"
    lines = dry_run(f"TORCH_INDEX={url}")
    torch = next(line for line in lines if "torch==2.13.0" in line)
    assert f"--extra-index-url {url} torch==2.13.0" in torch
    assert url in next(line for line in lines if line.startswith("echo "))
