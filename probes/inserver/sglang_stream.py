"""The SGLang plugin's per-iteration phase stream: one JSON-lines ring file per scheduler rank.

Each scheduler process appends its records to `specdecode-phases-dp{D}-tp{T}.jsonl` in the
stream directory: `SPECDECODE_STREAM_DIR`, which the plugin sets in SGLang's launching process
before the schedulers start (`choose_stream_dir`), so they inherit it; else SGLang's
`PROMETHEUS_MULTIPROC_DIR` (a process the launch hook did not run in). When a file holds `capacity` records it becomes `<name>.1` (replacing
the older one) and a new file starts, so at most 2 x capacity records stay on disk.

Why files: the records are made in the scheduler processes, while HTTP is served by another
process; SGLang's IPC between them is typed and closed to plugins. A file in a directory both
already share needs no new channel. The plugin's HTTP route (`/specdecode/phases`, served by
SGLang's own HTTP process) and local readers both go through `read_records()`.

Stdlib only; the writer must never raise into SGLang's scheduler loop (errors turn it off).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

PREFIX = "specdecode-phases"
_NAME = re.compile(r"^specdecode-phases-dp(\d+)-tp(\d+)\.jsonl$")
DEFAULT_CAPACITY = 2048
MAX_LIMIT = 4096
STREAM_ENV = "SPECDECODE_STREAM_DIR"


def stream_dir(environ: dict[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    d = env.get(STREAM_ENV) or env.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(d) if d else None


def choose_stream_dir(environ: dict[str, str] | None = None) -> tuple[Path, bool]:
    """(directory, made): the stream directory for this launch, put into the environment.

    Called in the process that starts the schedulers, before it starts them: child processes
    inherit the environment, so every rank and the HTTP process agree on one directory whatever
    SGLang's flags. A directory the user set is kept as is. Otherwise a private (0700) temporary
    directory is made and removed when this process exits (not when a forked child exits).
    """
    env = os.environ if environ is None else environ
    if env.get(STREAM_ENV):
        return Path(env[STREAM_ENV]), False
    d = tempfile.mkdtemp(prefix="specdecode-phases-")
    env[STREAM_ENV] = d
    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(d, ignore_errors=True))
    return Path(d), True


def stream_path(directory: Path, dp: int, rank: int) -> Path:
    return Path(directory) / f"{PREFIX}-dp{int(dp)}-tp{int(rank)}.jsonl"


class RingWriter:
    """Appends records for one rank; rotates at `capacity` records."""

    def __init__(self, directory: Path, dp: int, rank: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.path = stream_path(directory, dp, rank)
        self.capacity = capacity
        self.count = 0
        self.error: str | None = None
        self._f = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # A restarted rank starts a fresh stream; an old file would hold unrelated seqs.
            for p in (self.path, self.path.with_name(self.path.name + ".1")):
                if p.exists():
                    p.unlink()
            self._f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            self.error = f"cannot write {self.path}: {e}"

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        if self._f is None:
            return
        try:
            # "seq" first: readers find it without parsing the line.
            lines = [json.dumps({"seq": r["seq"], **r}, separators=(",", ":")) + "\n"
                     for r in records]
            for line in lines:
                if self.count >= self.capacity:
                    self._rotate()
                self._f.write(line)
                self.count += 1
            self._f.flush()
        except (OSError, ValueError, TypeError, KeyError) as e:
            self.error = f"stream write failed, stream off: {e}"
            self.close()

    def _rotate(self) -> None:
        assert self._f is not None
        self._f.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._f = open(self.path, "a", encoding="utf-8")
        self.count = 0

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None


def list_streams(directory: Path) -> list[dict[str, int]]:
    """The ranks that have a stream in the directory, as {"dp", "rank"} sorted."""
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        m = _NAME.match(name)
        if m:
            out.append({"dp": int(m.group(1)), "rank": int(m.group(2))})
    return sorted(out, key=lambda d: (d["dp"], d["rank"]))


def _seq_of(line: str) -> int | None:
    # Writers put "seq" first, so a record's seq is read without parsing the whole line.
    if not line.startswith('{"seq":'):
        return None
    end = line.find(",", 7)
    try:
        return int(line[7:end])
    except ValueError:
        return None


def _records_after(path: Path, after: int, into: dict[int, dict[str, Any]]) -> int | None:
    """Parse complete lines with seq > after into `into`; return the largest seq seen at all."""
    try:
        data = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    last = None
    for line in data.split("\n")[:-1]:      # the last piece is empty or a line being written
        seq = _seq_of(line)
        if seq is None:
            continue
        last = seq if last is None else max(last, seq)
        if seq > after and seq not in into:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                into[seq] = rec
    return last


def read_records(directory: Path, *, dp: int = 0, rank: int = 0, after: int = 0,
                 limit: int = 256) -> dict[str, Any]:
    """`{"next", "dropped", "records"}` as the reference engine's /specdecode/phases.

    `records` are those with seq > after, oldest first, at most `limit`; `next` is the seq to pass
    as `after` next time; `dropped` counts records after `after` that were overwritten before
    this read (the reader fell behind). A stream restarted by a new rank process (its newest seq
    is below `after`) is read from its start.
    """
    limit = max(1, min(int(limit), MAX_LIMIT))
    after = max(0, int(after))
    path = stream_path(directory, dp, rank)
    older = path.with_name(path.name + ".1")
    for _ in range(2):
        found: dict[int, dict[str, Any]] = {}
        # Newer file first: a rotation between the two reads then duplicates (deduped by seq)
        # instead of losing the records that moved.
        last_new = _records_after(path, after, found)
        last_old = _records_after(older, after, found)
        last = max((x for x in (last_new, last_old) if x is not None), default=None)
        if last is not None and last < after:
            after = 0
            continue
        break
    seqs = sorted(found)
    dropped = seqs[0] - after - 1 if seqs else 0
    page = [found[s] for s in seqs[:limit]]
    return {"next": page[-1]["seq"] if page else after, "dropped": dropped, "records": page}
