"""Make the TUI's committed tuning recording: `specdecode-tune tune --out` against the real engine
(TP 2 on CPU, the agreeing random-weight preset), a small space and budget, so the replayed tune
screen (u on a replay) has a real tuning to show.

    python -m tests.tui.make_tuning_fixture tests/tui/fixtures/tuning.db   (from the repository root)

Regenerate only on purpose, then update the snapshots that replay it after looking at them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .helpers import ROOT, Engine

TUNE_ARGS = ("--budget", "60s", "--max-steps", "3", "--placements", "sharded,rank0", "--load", "2",
             "--max-new-tokens", "48", "--apply")


def record(path: Path) -> None:
    engine = Engine("--speculative-num-steps", "3", "--max-running-requests", "4")
    try:
        path.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "tuner", "tune", engine.url, *TUNE_ARGS, "--out", str(path)],
                       cwd=ROOT, env=env, check=True)
    finally:
        engine.stop()


if __name__ == "__main__":
    record(Path(sys.argv[1]))
