"""What every benchmark script imports first: this checkout's root on `sys.path`.

`python benchmarks/NAME.py` puts only `benchmarks/` on the path (Python adds a script's own folder),
so `import common` works from any script, and from then on `tuner`, `refengine`, `probes` (and the
sibling helpers: `engine_runs`, `cuda_timing`, `schedule_ab`, ...) import from this tree, installed
or not. This is the one place a benchmark edits `sys.path`.

    import common  # noqa: F401  (this checkout on sys.path)
    from common import ROOT
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"


def on_path(*folders: Path) -> None:
    """Put folders at the front of sys.path, in the order given."""
    sys.path[:0] = [str(f) for f in folders]


on_path(ROOT, BENCHMARKS)
