"""`specdecode-tune analyze PATH [--json]`: where decode time goes, from a captured trace.

PATH is one rank's chrome trace (.json or .json.gz) or a directory holding one capture's rank files
(`{profile_id}-TP-{rank}.trace.json.gz`). Prints a table per rank and a cross-rank summary, or the
analysis dict (probes.trace_result) as JSON. Bad input is one line on stderr and exit status 1;
this module must not let a traceback reach the user.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

from tuner.commands.options import fail

MODE_TEXT = {
    "gpu": "gpu (kernels attributed through their launching calls to the enclosing phase span)",
    "cpu": "cpu (no kernels: CPU ops inside the phase spans of the engine thread)",
    "mixed": "mixed (some ranks have kernels, some not)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="a trace file, or a directory of one capture's rank files")
    parser.add_argument("--json", action="store_true", help="print the analysis as JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from probes.trace_analysis import TraceAnalysisError, analyze_path
    from probes.trace_stream import TraceFormatError

    try:
        analysis = analyze_path(args.path)
    except (TraceFormatError, TraceAnalysisError) as e:
        return fail("analyze", being_written(args.path, str(e)) or e, 1)
    except OSError as e:
        return fail("analyze", f"{args.path}: {e.strerror or e}", 1)
    data = analysis.to_dict()
    text = json.dumps(data, indent=1) + "\n" if args.json else format_table(data)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `analyze ... | head`: the reader left; that is not an error worth a traceback.
        sys.stdout = open(os.devnull, "w")
    return 0


WRITING_S = 60.0
"""A file cut short that changed this recently is taken as one the profiler is still writing."""


def being_written(path: Any, error: str, now: float | None = None) -> str:
    """The one line for a trace file that ends early and changed within WRITING_S ("still being
    written: wait and retry"), or "" (the error stands as it is)."""
    if "truncated" not in error:
        return ""
    try:
        age = (time.time() if now is None else now) - os.stat(path).st_mtime
    except OSError:
        return ""
    if not 0 <= age <= WRITING_S:
        return ""
    return f"{os.path.basename(str(path))}: still being written (changed {age:.0f} s ago, ends early): wait and retry"


def format_table(d: dict[str, Any]) -> str:
    """The human view of an analysis dict: mean per iteration for every rank, then across ranks."""
    lines = [f"mode: {MODE_TEXT.get(d['mode'], d['mode'])}"]
    for r in d["ranks"]:
        n = len(r["iterations"])
        m = r["mean"]
        wall = m["wall_ms"] or float("nan")
        lines += [
            "",
            f"rank {r['rank']}  {r['file']}  {n} iterations"
            + ("  (verify / verify_sample derived from SGLang's spans)" if r["derived_verify"] and n else ""),
            f"  per iteration: wall {m['wall_ms']:.3f} ms  busy {m['busy_ms']:.3f} ms  "
            f"comm {m['comm_ms']:.3f} ms  idle {m['idle_ms']:.3f} ms ({100 * m['idle_ms'] / wall:.1f}% of wall)",
        ]
        phases = m["phases"]
        lines += _phase_table(d["phases"], [("ms/iter", 10, lambda p: phases[p]["ms"], ".3f"),
                                            ("comm ms", 10, lambda p: phases[p]["comm_ms"], ".3f"),
                                            ("span ms", 10, lambda p: phases[p]["span_ms"], ".3f"),
                                            ("% wall", 9, lambda p: 100 * phases[p]["ms"] / wall, ".1f")])
        if r["unattributed_kernels"]:
            lines.append(f"  {r['unattributed_kernels']} kernels ({r['unattributed_ms']:.3f} ms) without a launching call")
    a = d.get("across")
    if a:
        n = a["aligned_iterations"] or 1
        lines += [
            "",
            f"across ranks {a['ranks']}: {a['aligned_iterations']} iterations aligned by the n-th draft span",
            f"  slowest rank {a['slowest_rank']} (most compute); skew {a['skew_ms'] / n:.3f} ms/iter "
            f"(max - min compute); wall {a['wall_ms']['min'] / n:.3f}..{a['wall_ms']['max'] / n:.3f} ms/iter",
        ]
        across = a["phases"]
        lines += _phase_table(d["phases"], [("max ms/it", 11, lambda p: across[p]["max_ms"] / n, ".3f"),
                                            ("min ms/it", 11, lambda p: across[p]["min_ms"] / n, ".3f"),
                                            ("skew/it", 10, lambda p: across[p]["skew_ms"] / n, ".3f"),
                                            ("slowest", 9, lambda p: across[p]["slowest_rank"], "")])
    for w in d["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"


def _phase_table(phases: list[str], columns: list[tuple[str, int, Callable[[str], Any], str]]) -> list[str]:
    """A header and one row per phase; a column is (title, width, its value for a phase, format)."""
    rows = [f"  {'phase':<14}" + "".join(f"{title:>{width}}" for title, width, _, _ in columns)]
    for p in phases:
        rows.append(f"  {p:<14}" + "".join(f"{value(p):>{width}{fmt}}" for _, width, value, fmt in columns))
    return rows
