"""Session fixtures for the SGLang contract tests: sglang 0.5.23's wheel, fetched once.

The wheel is downloaded without dependencies (`pip download sglang==0.5.23 --no-deps`) into
`.cache/` (git-ignored) and installed without dependencies into `.cache/sglang-0.5.23-target`.
Tests that need it skip with the pip error only when the package registry cannot be reached;
any other failure to get the wheel fails them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache"
VERSION = "0.5.23"
WHEEL_DIR = CACHE / f"sglang-{VERSION}-wheel"
TARGET = CACHE / f"sglang-{VERSION}-target"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

PAYLOAD_SERVER = Path(__file__).resolve().parent / "sglang_payload_server.py"


@contextmanager
def payload_server(*args: str) -> Iterator[str]:
    """The recorded-shape SGLang payload server (sglang_payload_server.py) on a free loopback port,
    as a real process; yields its URL once it said "ready", kills it on the way out."""
    from harness import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(PAYLOAD_SERVER), "--port", str(port), *args],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def start_payload_server():
    """payload_server, for the test modules (they cannot import this conftest)."""
    return payload_server


_UNREACHABLE = ("Could not fetch URL", "connection", "Connection", "Temporary failure in name",
                "Network is unreachable", "timed out", "ProxyError", "Max retries exceeded")


def _pip(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    found = sorted(WHEEL_DIR.glob(f"sglang-{VERSION}-*.whl"))
    if found:
        return found[0]
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    out = _pip("download", f"sglang=={VERSION}", "--no-deps", "-d", str(WHEEL_DIR))
    found = sorted(WHEEL_DIR.glob(f"sglang-{VERSION}-*.whl"))
    if found:
        return found[0]
    text = out.stdout + out.stderr
    if any(s in text for s in _UNREACHABLE):
        pytest.skip(f"package registry unreachable, cannot fetch sglang=={VERSION}: "
                    f"{text.strip().splitlines()[-1]}")
    pytest.fail(f"pip download sglang=={VERSION} --no-deps failed:\n{text[-2000:]}")


@pytest.fixture(scope="session")
def sglang_target(sglang_wheel: Path) -> Path:
    """The wheel installed with `pip install --no-deps --target` (cached across runs)."""
    marker = TARGET / ".complete"
    if marker.exists():
        return TARGET
    tmp = TARGET.with_name(TARGET.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    out = _pip("install", "--no-deps", "--no-compile", "--target", str(tmp), str(sglang_wheel))
    if out.returncode != 0:
        pytest.fail(f"pip install --no-deps --target failed:\n{(out.stdout + out.stderr)[-2000:]}")
    shutil.rmtree(TARGET, ignore_errors=True)
    tmp.rename(TARGET)
    marker.write_text(sglang_wheel.name)
    return TARGET


@pytest.fixture(scope="session")
def sglang_src(sglang_target: Path) -> Path:
    """The `sglang/` package directory of the installed wheel."""
    return sglang_target / "sglang"
