"""Result files folded one per question (benchmarks/results/): how scripts read and extend them.

A folded file is a JSON object holding several runs of one question: either keyed by each run's
former file name (`{"folded": ..., "batch_cost_h200_matmuls": {...}, ...}`), read as `FILE#KEY`, or
a series a script summarises (`{"runs": [...]}`), which `append_run` extends. Must not decide what a
run means (the scripts do) and must not write anything but the file it is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class FoldedError(ValueError):
    """The file or its key cannot be read (one line, naming the file)."""


def read(spec: str | Path) -> Any:
    """`FILE` or `FILE#KEY`: the JSON in FILE, or the run under KEY of a folded FILE."""
    path, _, key = str(spec).partition("#")
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise FoldedError(f"{path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FoldedError(f"{path}: not JSON ({str(e).splitlines()[0]})") from None
    if not key:
        return doc
    if not isinstance(doc, dict) or key not in doc:
        keys = ", ".join(k for k in doc if k != "folded") if isinstance(doc, dict) else "none"
        raise FoldedError(f"{path}: no run {key!r} (runs: {keys})")
    return doc[key]


def runs(doc: Any) -> list[Any]:
    """The runs of a series file (`{"runs": [...]}`), or the one run of a plain run file."""
    if isinstance(doc, dict) and isinstance(doc.get("runs"), list):
        return doc["runs"]
    return [doc]


def append_run(path: Path, run: dict, replace_last: bool = False) -> None:
    """Add `run` to the series in `path` (created when absent; a plain run file already there
    becomes the series' first run). `replace_last`: the run is being rewritten as it goes."""
    series: list[Any] = []
    if path.exists():
        series = runs(read(path))
        if replace_last and series:
            series = series[:-1]
    path.write_text(json.dumps({"runs": [*series, run]}, indent=1, default=str) + "\n")
