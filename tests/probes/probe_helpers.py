"""Helpers shared by the probes tests (a uniquely named module, so no other test directory shadows it)."""

from __future__ import annotations

import json
from pathlib import Path

CPU_ITERATIONS = 6


def load_timers(directory: Path, rank: int) -> list[dict[str, float]]:
    """The phase timers cpu_trace_program.py kept for one rank, one dict per iteration."""
    return json.loads((directory / f"timers-{rank}.json").read_text())
