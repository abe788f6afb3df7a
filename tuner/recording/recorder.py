"""The Recorder: writes every record the session drains into one SQLite file, on its own thread.

The writer thread owns the only connection (never the UI thread). WAL with synchronous=NORMAL and a
commit about every second, so a SIGKILL loses at most that second; close() checkpoints the WAL
(TRUNCATE) and returns to journal_mode=DELETE, so a finished recording is one plain file. A failure
of the writer (disk full, file removed) is kept in `error` and reported, never raised into the
session's tick. Must not read the store or import textual.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tuner import __version__
from tuner.core.records import Event, Record, Sample, Trace, thaw
from tuner.recording.outputs import OutputError, check_output
from tuner.recording.schema import (
    APPLICATION_ID, DDL, SCHEMA_VERSION, RecordingError, dumps, pack_trace, value_in,
)

COMMIT_EVERY_S = 1.0
_STOP = object()


def header_for(backend: Any, **extra: Any) -> dict[str, Any]:
    """The standard header for a recording of a live backend: what server, which launch and active
    arguments, what it could do, its rank processes (with PCI bus ids). GPUs known later (NVML) go
    in with Recorder.set_header("gpus", [...])."""
    info = dict(getattr(backend, "info", {}) or {})
    return {
        "backend": getattr(backend, "kind", "?"),
        "url": getattr(backend, "url", ""),
        "server_info": info,
        "launch": info.get("launch", {}),
        "active": info.get("active", {}),
        "capabilities": backend.capabilities.as_dict() if hasattr(backend, "capabilities") else {},
        "ranks": list(getattr(backend, "rank_info", []) or []),
        "gpus": [],
        **extra,
    }


def not_replaceable_recording(path: Path) -> str | None:
    """None when `path` is an empty file or a specdecode-tune recording (`record --overwrite` may
    replace it); else why not. Opened read-only and immutable: the check writes nothing."""
    try:
        if path.stat().st_size == 0:
            return None
        with open(path, "rb") as f:
            if not f.read(16).startswith(b"SQLite format 3\0"):
                return "is not a specdecode-tune recording (not an SQLite file)"
        db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            row = None
            if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        finally:
            db.close()
    except (OSError, sqlite3.Error, ValueError):     # ValueError: damaged text (not UTF-8)
        return "is not a readable specdecode-tune recording"
    if row is None:
        return "is an SQLite file but not a specdecode-tune recording"
    return None


class Recorder:
    """Append-only writer of one recording.

    Args:
        path: the file to create (an existing file is refused unless overwrite=True).
        overwrite: replace an existing recording or empty file; anything else (a directory, a device,
            a file of another kind) is still refused.
        header: what the recording is of: backend, url, server_info, launch, active, gpus, ... (JSON).
        commit_every_s: the most a SIGKILL can lose.
        monotonic: the clock commits are paced by (injected in tests).
    """

    def __init__(self, path: str | Path, header: dict[str, Any] | None = None, *, overwrite: bool = False,
                 commit_every_s: float = COMMIT_EVERY_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        try:
            check_output(self.path, overwrite=overwrite, may_replace=not_replaceable_recording)
        except OutputError as e:
            raise RecordingError(str(e).replace("cannot write ", "cannot create recording ", 1)) from None
        if overwrite and self.path.exists():
            # Only a recording or an empty regular file gets here (checked above).
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
        self.commit_every_s = commit_every_s
        self._monotonic = monotonic
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready = threading.Event()
        self.error: str | None = None
        self.written = 0
        self.commits = 0
        meta = {"schema_version": SCHEMA_VERSION, "tool": "specdecode-tune", "tool_version": __version__,
                "created_at": time.time(), **(header or {})}
        self._thread = threading.Thread(target=self._run, args=(meta,), name="recorder", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self.error:
            raise RecordingError(self.error)

    # -- called by the session (any thread) -------------------------------------------------------

    def write(self, records: list[Record]) -> None:
        if records and self._thread.is_alive():
            self._q.put(list(records))

    def for_server(self, name: str) -> "ServerSink":
        """A sink for one fleet member's session: its records go into this file under `name`.
        Closing the sink closes nothing (the fleet's owner closes the recorder once)."""
        return ServerSink(self, name)

    def _write_as(self, server: str, records: list[Record]) -> None:
        if records and self._thread.is_alive():
            self._q.put(("records", server, list(records)))

    def set_header(self, key: str, value: Any) -> None:
        """Add or replace one header entry (e.g. GPUs, known only after the first NVML read)."""
        self._q.put(("meta", key, value))

    def flush(self, timeout: float = 10.0) -> None:
        """Commit everything queued so far (tests and the `record` command's progress use it)."""
        done = threading.Event()
        self._q.put(("flush", done))
        done.wait(timeout if self._thread.is_alive() else 0)

    def close(self) -> None:
        """Write what is queued, then leave one self-contained file. Idempotent."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join()

    # -- the writer thread ------------------------------------------------------------------------

    def _run(self, meta: dict[str, Any]) -> None:
        db = None
        try:
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("BEGIN")
            for statement in DDL.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           [(k, dumps(v)) for k, v in meta.items()])
            db.execute("COMMIT")
        except (sqlite3.Error, OSError) as e:
            self.error = f"cannot create recording {self.path}: {e}"
            # Nothing of a recording that could not be created is left behind (it did not exist
            # before: check_output refused an existing file, or overwrite removed it).
            try:
                if db is not None:
                    db.close()
                for suffix in ("", "-wal", "-shm"):
                    Path(str(self.path) + suffix).unlink(missing_ok=True)
            except (sqlite3.Error, OSError):
                pass
            self._ready.set()
            return
        self._ready.set()
        series: dict[str, int] = {}
        seq = 0
        last_commit = self._monotonic()
        in_tx = False
        try:
            while True:
                timeout = max(0.0, self.commit_every_s - (self._monotonic() - last_commit))
                try:
                    item = self._q.get(timeout=timeout if in_tx else None)
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if item is not None and not in_tx:
                    db.execute("BEGIN")
                    in_tx = True
                if isinstance(item, list):
                    seq = self._insert(db, item, series, seq)
                elif isinstance(item, tuple) and item[0] == "records":
                    seq = self._insert(db, item[2], series, seq, item[1])
                elif isinstance(item, tuple) and item[0] == "meta":
                    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (item[1], dumps(item[2])))
                elif isinstance(item, tuple) and item[0] == "flush":
                    db.execute("COMMIT")
                    in_tx, last_commit = False, self._monotonic()
                    self.commits += 1
                    item[1].set()
                    continue
                if in_tx and self._monotonic() - last_commit >= self.commit_every_s:
                    db.execute("COMMIT")
                    in_tx, last_commit = False, self._monotonic()
                    self.commits += 1
            if in_tx:
                db.execute("COMMIT")
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('closed_at', ?)", (dumps(time.time()),))
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("PRAGMA journal_mode=DELETE")
            db.close()
        except (sqlite3.Error, OSError) as e:
            self.error = f"recording {self.path} stopped: {e}"
            try:
                db.close()
            except sqlite3.Error:
                pass
        finally:
            # Anyone waiting on a flush must not hang on a dead writer.
            while True:
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, tuple) and item[0] == "flush":
                    item[1].set()

    def _insert(self, db: sqlite3.Connection, records: list[Record], series: dict[str, int], seq: int,
                server: str = "") -> int:
        samples, events, traces = [], [], []
        for r in records:
            seq += 1
            if isinstance(r, Sample):
                sid = series.get(r.series)
                if sid is None:
                    cur = db.execute("INSERT INTO series (name) VALUES (?)", (r.series,))
                    sid = series[r.series] = int(cur.lastrowid)
                samples.append((seq, r.t, sid, value_in(float(r.value)), server))
            elif isinstance(r, Event):
                events.append((seq, r.t, r.kind, dumps(thaw(r.data)), server))
            elif isinstance(r, Trace):
                comp, blob = pack_trace(r.data)
                traces.append((seq, r.t, r.trace_id, r.rank, r.name, comp, blob,
                               None if r.analysis is None else dumps(thaw(r.analysis)), server))
        if samples:
            db.executemany("INSERT INTO samples (seq, t, series_id, value, server) VALUES (?, ?, ?, ?, ?)", samples)
        if events:
            db.executemany("INSERT INTO events (seq, t, kind, data, server) VALUES (?, ?, ?, ?, ?)", events)
        if traces:
            db.executemany("INSERT INTO traces (seq, t, trace_id, rank, name, compression, data, analysis, server) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", traces)
        self.written += len(records)
        return seq


class ServerSink:
    """What one fleet member's Session writes to: the shared Recorder, tagged with the member's name."""

    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    @property
    def error(self) -> str | None:
        return self.recorder.error

    def write(self, records: list[Record]) -> None:
        self.recorder._write_as(self.name, records)

    def set_header(self, key: str, value: Any) -> None:
        self.recorder.set_header(key, value)

    def flush(self, timeout: float = 10.0) -> None:
        self.recorder.flush(timeout)

    def close(self) -> None:
        """The member's session ended; the file stays open for the others."""
