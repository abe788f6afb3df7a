"""py-spy on the server's rank processes: top functions per process, with idle and GIL shares.

`sample_processes(pids)` runs, for each PID and at the same time, three `py-spy record --format raw
--threads --function --nonblocking` samplers of `duration_s`: one with `--idle` (every thread at
every tick: the denominator), one without (threads doing something), one with `--gil` (the thread
holding the GIL). Raw output is collapsed stacks (`thread (tid): name;frame;...;frame COUNT`);
`parse_collapsed` turns it into counts, `function_shares` into own/total shares.
The three read the process's memory side by side, so they run `--nonblocking` (never pausing the
server; native frames would need pausing, so they are not offered). `dump_process(pid)` is the one-shot `py-spy dump --json` (which thread is active, who holds the GIL).

Callers find the PIDs from `specdecode:rank_info`; only ints are accepted, and py-spy is always run
from an argv list, never a shell string. Must not import tuner; must not leave a py-spy running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>\w+)\)(?::\s?(?P<name>.*))?$")
PERMISSION_HINT = ("py-spy needs ptrace rights on the server's processes: run specdecode-tune as the "
                   "server's user or as root, or allow it with `sudo sysctl kernel.yama.ptrace_scope=0`; "
                   "in a container add `--cap-add SYS_PTRACE`")


class PySpyError(RuntimeError):
    """py-spy could not sample at all; the message is one line saying what to do."""


class PySpyPermissionError(PySpyError):
    """The OS refused py-spy access to a process (ptrace)."""


@dataclass(frozen=True)
class FunctionShare:
    function: str
    file: str
    line: int | None
    own: int
    """Samples with this function on top of the stack."""
    total: int
    """Samples with this function anywhere on the stack (counted once per sample)."""
    own_pct: float
    total_pct: float

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass
class ProcessProfile:
    pid: int
    samples: int = 0
    """Active thread samples (what the function shares are over)."""
    thread_samples: int = 0
    """Every thread at every tick, idle or not."""
    threads: int = 0
    ticks: int = 0
    gil_samples: int = 0
    idle_pct: float = float("nan")
    """Share of thread samples in which the thread was idle (waiting, sleeping, blocked in I/O)."""
    gil_pct: float = float("nan")
    """Share of ticks in which some thread of this process held the GIL."""
    functions: list[FunctionShare] = field(default_factory=list)
    error: str | None = None


@dataclass
class PySpyResult:
    processes: list[ProcessProfile]
    duration_s: float
    rate: int
    functions: list[FunctionShare]
    """Top functions over every process's active samples together."""
    warnings: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.processes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples"] = self.samples
        return d


# -------------------------------------------------------------------------------------------------
# Parsing (pure)


def parse_frame(text: str) -> tuple[str, str, int | None]:
    """`func (file:line)` -> (func, file, line); anything else -> (text, "", None)."""
    m = _FRAME.match(text)
    if not m:
        return text, "", None
    line = m.group("line")
    return m.group("func"), m.group("file"), int(line) if line else None


def parse_collapsed(text: str) -> list[tuple[str | None, tuple[str, ...], int]]:
    """Collapsed stacks -> [(thread id or None, frames outermost first, count)]; bad lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.rstrip()
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit() or not stack:
            continue
        frames = stack.split(";")
        tid = None
        m = _THREAD.match(frames[0])
        if m:
            tid = m.group("tid")
            frames = frames[1:]
        out.append((tid, tuple(frames), int(count)))
    return out


def function_shares(stacks: list[tuple[str | None, tuple[str, ...], int]], top: int | None = 40) -> list[FunctionShare]:
    """Own and total samples per function, as shares of all samples, largest own first."""
    total_samples = sum(c for _, _, c in stacks)
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for _, frames, count in stacks:
        if not frames:
            continue
        own[frames[-1]] += count
        for f in set(frames):  # recursion counts once per sample
            anywhere[f] += count
    rows = []
    for frame, tot in anywhere.items():
        func, file, line = parse_frame(frame)
        o = own.get(frame, 0)
        rows.append(FunctionShare(func, file, line, o, tot, 100.0 * o / total_samples if total_samples else 0.0,
                                  100.0 * tot / total_samples if total_samples else 0.0))
    rows.sort(key=lambda r: (-r.own, -r.total, r.function))
    return rows[:top] if top else rows


def profile_from_outputs(pid: int, all_text: str, active_text: str, gil_text: str) -> ProcessProfile:
    """Combine the three recordings of one process (see the module docstring) into its profile."""
    everything = parse_collapsed(all_text)
    active = parse_collapsed(active_text)
    gil = parse_collapsed(gil_text)
    per_thread: Counter[str | None] = Counter()
    for tid, _, c in everything:
        per_thread[tid] += c
    p = ProcessProfile(pid=pid)
    p.thread_samples = sum(per_thread.values())
    p.threads = len(per_thread)
    p.ticks = max(per_thread.values(), default=0)
    p.samples = sum(c for _, _, c in active)
    p.gil_samples = sum(c for _, _, c in gil)
    if p.thread_samples:
        p.idle_pct = max(0.0, 100.0 * (1.0 - p.samples / p.thread_samples))
    if p.ticks:
        p.gil_pct = min(100.0, 100.0 * p.gil_samples / p.ticks)
    p.functions = function_shares(active)
    return p


def explain_failure(pid: int, stderr: str) -> PySpyError:
    """py-spy's stderr -> one line saying what happened and what to do."""
    lower = stderr.lower()
    if "permission denied" in lower or "operation not permitted" in lower or "os error 1)" in lower:
        return PySpyPermissionError(f"process {pid}: permission denied. {PERMISSION_HINT}")
    if "no such process" in lower or "no such file or directory" in lower or "failed to open process" in lower:
        return PySpyError(f"process {pid} does not exist (did the server restart? re-read its rank_info)")
    if "failed to find python version" in lower or "not a python" in lower:
        return PySpyError(f"process {pid}: py-spy did not find a Python interpreter in it "
                          "(not a Python process, still starting, or a Python py-spy does not support)")
    first = next((ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("Error")), None)
    first = first or next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "no output")
    return PySpyError(f"process {pid}: py-spy failed: {first[:200]}")


# -------------------------------------------------------------------------------------------------
# Running py-spy


def validate_pids(pids: Any) -> list[int]:
    """PIDs as positive ints; anything else (a server sent it) is refused, never passed to a command."""
    out = []
    for p in pids:
        if isinstance(p, bool):
            raise ValueError(f"not a process id: {p!r}")
        if isinstance(p, str) and p.isdigit():
            p = int(p)
        if not isinstance(p, int) or p <= 0:
            raise ValueError(f"not a process id: {p!r}")
        out.append(p)
    return out


def find_py_spy() -> str:
    """The py-spy executable: next to this interpreter (a venv's bin) or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if not found:
        raise PySpyError("py-spy is not installed: `pip install py-spy`")
    return found


def sample_processes(pids: Any, duration_s: float = 2.0, rate: int = 100, *,
                     py_spy: list[str] | None = None, top: int = 40) -> PySpyResult:
    """Sample every PID at once for `duration_s`; per-process failures become that process's error.

    Args:
        pids: the rank processes (ints; from `specdecode:rank_info`).
        duration_s: seconds to sample (py-spy takes whole seconds; at least 1).
        rate: samples per second.
        py_spy: the command to run py-spy as an argv prefix (default: the installed py-spy).
    Raises:
        PySpyError / PySpyPermissionError when no process could be sampled at all.
    """
    pids = validate_pids(pids)
    if not pids:
        raise PySpyError("no processes to sample")
    rate = int(rate)
    seconds = max(1, int(round(duration_s)))
    cmd = list(py_spy) if py_spy else [find_py_spy()]
    kinds = {"all": ["--idle"], "active": [], "gil": ["--gil"]}
    procs: dict[tuple[int, str], tuple[subprocess.Popen, Path]] = {}
    with tempfile.TemporaryDirectory(prefix="specdecode-pyspy-") as tmp:
        os.chmod(tmp, 0o777)  # a py-spy run as another user (py_spy prefix) must write its output here
        try:
            for pid in pids:
                for kind, extra in kinds.items():
                    out = Path(tmp) / f"{pid}-{kind}.txt"
                    argv = [*cmd, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
                            "--format", "raw", "--threads", "--function", "--nonblocking",
                            "--output", str(out), *extra]
                    procs[(pid, kind)] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                           stdin=subprocess.DEVNULL, text=True), out)
        except FileNotFoundError:
            _kill_all(procs)
            raise PySpyError(f"py-spy is not installed ({cmd[0]} not found): `pip install py-spy`") from None
        errors: dict[int, PySpyError] = {}
        texts: dict[tuple[int, str], str] = {}
        for (pid, kind), (proc, out) in procs.items():
            try:
                _, stderr = proc.communicate(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
                stderr = "Error: py-spy did not finish in time"
            if proc.returncode != 0 or not out.exists():
                errors.setdefault(pid, explain_failure(pid, stderr or ""))
                continue
            texts[(pid, kind)] = out.read_text(errors="replace")
    profiles = []
    for pid in pids:
        if pid in errors:
            profiles.append(ProcessProfile(pid=pid, error=str(errors[pid])))
            continue
        profiles.append(profile_from_outputs(pid, texts[(pid, "all")], texts[(pid, "active")], texts[(pid, "gil")]))
    if len(errors) == len(pids):
        first = errors[pids[0]]
        raise type(first)(str(first) if len(pids) == 1 else f"{first} (and {len(pids) - 1} more)")
    merged: list[tuple[str | None, tuple[str, ...], int]] = []
    for pid in pids:
        if (pid, "active") in texts:
            merged += parse_collapsed(texts[(pid, "active")])
    warnings = [p.error for p in profiles if p.error]
    return PySpyResult(processes=profiles, duration_s=float(seconds), rate=rate,
                       functions=function_shares(merged, top), warnings=warnings)


def dump_process(pid: Any, py_spy: list[str] | None = None, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """One `py-spy dump --json` of a process: its threads with `active`, `owns_gil` and frames."""
    (pid,) = validate_pids([pid])
    cmd = list(py_spy) if py_spy else [find_py_spy()]
    try:
        r = subprocess.run([*cmd, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise PySpyError(f"py-spy is not installed ({cmd[0]} not found): `pip install py-spy`") from None
    except subprocess.TimeoutExpired:
        raise PySpyError(f"process {pid}: py-spy dump did not finish in {timeout_s:.0f} s") from None
    if r.returncode != 0:
        raise explain_failure(pid, r.stderr)
    try:
        threads = json.loads(r.stdout)
    except ValueError:
        raise PySpyError(f"process {pid}: py-spy dump gave no JSON") from None
    return threads if isinstance(threads, list) else []


def _kill_all(procs: dict) -> None:
    for proc, _ in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
