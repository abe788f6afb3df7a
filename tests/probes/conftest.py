"""Shared, expensive fixtures for the probes tests: real torch-profiler traces from a TP2 gloo run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from probe_helpers import CPU_ITERATIONS

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"


@pytest.fixture(scope="session")
def cpu_capture(tmp_path_factory) -> Path:
    """A directory with cpu-TP-{0,1}.trace.json and timers-{0,1}.json from a real 2-rank gloo run."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("cpu_capture")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(HERE / "cpu_trace_program.py"), str(out), str(CPU_ITERATIONS)],
                   check=True, timeout=300, env=env, capture_output=True)
    return out

