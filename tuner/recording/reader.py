"""Reading recordings: the header, records in the order they were seen, time seeks; damaged files
read as far as they go.

Readers never write next to their input: a finished recording is opened read-only and immutable (no
-wal/-shm appears beside it); a crashed one (.db plus -wal) is recovered in a private temporary copy
of both files, where SQLite replays the WAL, and the copy goes when the reader closes. A -wal that is
missing (the header says WAL mode and the file was not closed) or unreadable is named, together with
what the file holds without it. A file that is not a recording, or is from a newer schema, or is
truncated, gives a one-line `problem` (or a RecordingError when nothing at all can be read); whatever
is readable is still returned. A fleet recording (schema 2) is read one member at a time
(`open_recording(path, server=NAME)`: that member's records, its header over the file's); a schema-1
file has no server column and reads as the one server it is. Must not import textual.
"""

from __future__ import annotations

import heapq
import json
import math
import shutil
import sqlite3
import tempfile
import weakref
import zlib
from pathlib import Path
from typing import Any, Iterator

from tuner.core.records import Event, Record, Sample, Trace
from tuner.recording.schema import (
    APPLICATION_ID, FLEET_KEY, SCHEMA_VERSION, SERVER_KEY, RecordingError, unpack_trace, value_out,
)

CHUNK = 5000
# What reading a damaged file can raise: SQLite's errors, and names in a damaged schema that are
# not UTF-8 (the sqlite3 module decodes column names itself).
_DB_ERRORS = (sqlite3.DatabaseError, ValueError)
# Damaged stretches skipped per table before giving up (a file damaged all over reads no further).
MAX_SKIPS = 1000


def open_recording(path: str | Path, server: str | None = None) -> "RecordingReader":
    """Open a recording for reading (server: one fleet member's part). Raises RecordingError only
    when nothing in it can be read, or when it has no member of that name."""
    return RecordingReader(path, server)


def fleet_members(header: dict[str, Any]) -> list[dict[str, Any]]:
    """A fleet recording's members ({name, url}, in the fleet's order); [] for one server."""
    members = header.get(FLEET_KEY)
    if not isinstance(members, list):
        return []
    return [m for m in members if isinstance(m, dict) and isinstance(m.get("name"), str)]


class RecordingReader:
    """Attributes:
        header: the meta table (schema_version, tool_version, backend, server_info, launch, active, gpus, ...).
        problem: one line saying what is wrong with the file, or None.
        warnings: every problem met while reading (problem is the first).
    """

    def __init__(self, path: str | Path, server: str | None = None) -> None:
        self.path = Path(path)
        self.server = server
        self.warnings: list[str] = []
        self.recovered_copy = False      # True when a -wal was replayed in a private copy
        self._tmpdir: str | None = None
        self._warn_later: str | None = None
        if not self.path.is_file():
            raise RecordingError(f"{self.path}: no such recording")
        try:
            self.db = self._connect()
            self.header = self._read_header()
            self.schema_version = _schema_number(self.header.get("schema_version"), self.path)
        except BaseException:
            self._drop_copy()
            raise
        if server is not None:
            names = [m["name"] for m in fleet_members(self.header)]
            if server not in names:
                self.close()
                raise RecordingError(f"{self.path} has no server {server!r}"
                                     + (f" (servers: {', '.join(names)})" if names else " (it records one server)"))
            own = self.header.get(SERVER_KEY + server)
            self.header = {**self.header, **(own if isinstance(own, dict) else {}), "server": server}
        if self.schema_version > SCHEMA_VERSION:
            self._warn(f"{self.path.name} was written by a newer specdecode-tune (schema {self.schema_version} > "
                       f"{SCHEMA_VERSION}); upgrade to read all of it — showing what this version understands")
        self._series = self._read_series()
        self.t_first, self.t_last = self._time_range()

    @property
    def problem(self) -> str | None:
        return self.warnings[0] if self.warnings else None

    def _warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    # -- opening ----------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        wal = Path(str(self.path) + "-wal")
        wal_mode = self._check_length()
        source = self.path
        if wal.exists() or wal.is_symlink():
            copy = self._private_copy(wal)
            if copy is not None:
                source = copy
        elif wal_mode:
            self._warn_later = (f"{self.path.name} was not closed cleanly and its {wal.name} is missing: the "
                                "last commits (those still in the WAL) are lost; reading what the file holds")
        try:
            if source is self.path:
                # immutable: no locks, no -wal/-shm created beside the input, nothing written.
                # check_same_thread off: a fleet replay opens a member's reader on the poller's
                # thread and hands it to the UI's (one user at a time, never two at once).
                db = sqlite3.connect(f"file:{_uri_path(source)}?mode=ro&immutable=1", uri=True,
                                     check_same_thread=False)
            else:
                # The private copy: a read-write open replays the WAL there, the checkpoint makes it
                # one file; the input is untouched.
                db = sqlite3.connect(str(source), check_same_thread=False)
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            # Damaged text (invalid UTF-8) must read as text with replacement characters, not raise.
            db.text_factory = _text
            # On a truncated file SQLite refuses everything unless told to tolerate a database shorter
            # than its header says; reads then fail only on the pages that are really gone.
            db.execute("PRAGMA writable_schema=ON")
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.DatabaseError as e:
            if "not a database" in str(e) or "file is encrypted" in str(e):
                raise RecordingError(f"{self.path} is not a specdecode-tune recording (not an SQLite file)") from None
            raise RecordingError(f"{self.path} cannot be opened: {_line(e)}") from None

    def _private_copy(self, wal: Path) -> Path | None:
        """Copy the file and its -wal into a private temporary directory; None (with a warning
        naming the -wal) when the -wal cannot be read."""
        self._tmpdir = tempfile.mkdtemp(prefix="specdecode-recovery-")
        weakref.finalize(self, shutil.rmtree, self._tmpdir, True)
        copy = Path(self._tmpdir) / "recording.db"
        try:
            shutil.copyfile(self.path, copy)
        except OSError as e:
            raise RecordingError(f"{self.path} cannot be read: {e.strerror or e}") from None
        try:
            shutil.copyfile(wal, Path(str(copy) + "-wal"))
        except OSError as e:
            self._warn_later = (f"{self.path.name} was not closed cleanly and its {wal.name} cannot be read "
                                f"({e.strerror or e}): the last commits are missing; reading what the file holds")
            self._drop_copy()
            return None
        self.recovered_copy = True
        self._warn_later = f"{self.path.name} was not closed cleanly (recovered from its WAL in a private copy)"
        return copy

    def _drop_copy(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _check_length(self) -> bool:
        """Compare the file's length with the page count in its SQLite header (bytes 16-17, 28-31).
        Returns True when the header says WAL mode (bytes 18-19 are 2: a recorder that never closed)."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(100)
            size = self.path.stat().st_size
        except OSError as e:
            raise RecordingError(f"{self.path} cannot be read: {e.strerror or e}") from None
        if len(head) < 100 or not head.startswith(b"SQLite format 3\0"):
            if head.startswith(b"SQLite format 3"[: len(head)]) and len(head) < 100:
                raise RecordingError(f"{self.path} is truncated to {len(head)} bytes: nothing readable")
            raise RecordingError(f"{self.path} is not a specdecode-tune recording (not an SQLite file)")
        page = int.from_bytes(head[16:18], "big")
        page = 65536 if page == 1 else page
        pages = int.from_bytes(head[28:32], "big")
        if pages and size < pages * page and not Path(str(self.path) + "-wal").exists():
            self._warn(f"{self.path.name} is truncated ({size} of {pages * page} bytes); reading what is left")
        return head[18] == 2 and head[19] == 2

    def _read_header(self) -> dict[str, Any]:
        try:
            app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except _DB_ERRORS as e:
            raise RecordingError(f"{self.path} is damaged beyond reading: {_line(e)}") from None
        if "meta" not in tables:
            if self._warn_later and "not closed cleanly and its" in self._warn_later:
                raise RecordingError(self._warn_later.replace("; reading what the file holds",
                                                              ": the file alone holds no recording"))
            raise RecordingError(f"{self.path} is an SQLite file but not a specdecode-tune recording")
        if app_id not in (0, APPLICATION_ID):
            self._warn(f"{self.path.name}: unexpected application id {app_id:#x}")
        header: dict[str, Any] = {}
        try:
            for key, value in self.db.execute("SELECT key, value FROM meta"):
                if not isinstance(key, str):
                    continue
                header[key] = _json(value, value)
        except _DB_ERRORS as e:
            self._warn(f"{self.path.name}: header partly unreadable ({e})")
        if "schema_version" not in header:
            raise RecordingError(f"{self.path} has no schema version: not a specdecode-tune recording")
        warn = self._warn_later
        if warn:
            self._warn(warn)
        if "closed_at" not in header and not warn:
            self._warn(f"{self.path.name} was not closed cleanly (the recorder was killed); reading what it holds")
        self._tables = tables
        return header

    def _read_series(self) -> dict[int, str]:
        try:
            return {i: str(n) for i, n in self.db.execute("SELECT id, name FROM series") if isinstance(i, int)}
        except _DB_ERRORS as e:
            self._warn(f"{self.path.name} is truncated or corrupt: series names unreadable ({_line(e)})")
            return {}

    def _time_range(self) -> tuple[float, float]:
        lo, hi = math.inf, -math.inf
        for table in ("samples", "events", "traces"):
            if table not in self._tables:
                continue
            try:
                where, args = self._scope(table)
                a, b = self.db.execute(f"SELECT min(t), max(t) FROM {table} WHERE {where}", args).fetchone()
            except _DB_ERRORS as e:
                self._warn(f"{self.path.name} is truncated or corrupt ({table}: {_line(e)})")
                continue
            if _is_time(a) and _is_time(b):
                lo, hi = min(lo, a), max(hi, b)
        return (lo, hi) if lo <= hi else (math.nan, math.nan)

    # -- reading ----------------------------------------------------------------------------------

    def _scope(self, table: str) -> tuple[str, tuple]:
        """The WHERE clause keeping one member's rows (everything in a one-server reading)."""
        if self.server is None:
            return "1=1", ()
        return "server = ?", (self.server,)

    def servers(self) -> list[str]:
        """A fleet recording's member names; [] for a one-server recording."""
        return [m["name"] for m in fleet_members(self.header)]

    def series_names(self) -> list[str]:
        return sorted(set(self._series.values()))

    def _rows(self, table: str, cols: str, where: str, args: tuple) -> Iterator[tuple]:
        """Rows in seq order, in chunks; stops with a warning at the first unreadable page."""
        if table not in self._tables:
            return
        scope, extra = self._scope(table)
        where, args = f"{where} AND {scope}", (*args, *extra)
        last = -1
        skips = 0
        while True:
            try:
                rows = self.db.execute(f"SELECT seq, {cols} FROM {table} WHERE seq > ? AND {where} "
                                       f"ORDER BY seq LIMIT {CHUNK}", (last, *args)).fetchall()
            except _DB_ERRORS as e:
                # A damaged page: read row by row up to it, then look for readable rows past it.
                try:
                    cur = self.db.execute(f"SELECT seq, {cols} FROM {table} WHERE seq > ? AND {where} "
                                          "ORDER BY seq", (last, *args))
                    for row in cur:
                        if not isinstance(row[0], int) or row[0] <= last:
                            break          # out of order: damaged; skip past it below
                        yield row
                        last = row[0]
                except _DB_ERRORS:
                    pass   # the damaged page itself (or the plan reading it): skip past it below
                nxt = self._next_readable(table, last)
                self._warn(f"{self.path.name} is truncated or corrupt: {table} after seq {last} unreadable"
                           + (f" up to seq {nxt}" if nxt is not None else "") + f" ({_line(e)})")
                skips += 1
                if nxt is None or nxt <= last or skips > MAX_SKIPS:
                    return
                last = nxt - 1
                continue
            if not rows:
                return
            yield from rows
            if not isinstance(rows[-1][0], int) or rows[-1][0] <= last:
                # A damaged b-tree can hand back rows out of order or in a cycle: stop, do not loop.
                self._warn(f"{self.path.name} is corrupt: {table} rows out of order after seq {last}")
                return
            last = rows[-1][0]

    def _next_readable(self, table: str, last: int) -> int | None:
        """The first seq past a damaged stretch whose row can be read (None when none is found)."""
        step = 16
        while step <= 1 << 26:
            try:
                row = self.db.execute(f"SELECT seq FROM {table} WHERE seq > ? ORDER BY seq LIMIT 1",
                                      (last + step,)).fetchone()
                if row is None:
                    return None
                self.db.execute(f"SELECT * FROM {table} WHERE seq = ?", (row[0],)).fetchone()
                return int(row[0])
            except _DB_ERRORS:
                step *= 4
        return None

    def _samples(self, where: str, args: tuple) -> Iterator[tuple[int, Record]]:
        for seq, t, sid, v in self._rows("samples", "t, series_id, value", where, args):
            name = self._series.get(sid)
            if name is None:
                self._warn(f"{self.path.name}: samples of an unknown series id {sid!r} skipped")
                continue
            if not _is_time(t) or not (v is None or isinstance(v, (int, float))):
                self._warn(f"{self.path.name}: damaged samples (not numbers) skipped")
                continue
            yield seq, Sample(t, name, value_out(v))

    def _events(self, where: str, args: tuple) -> Iterator[tuple[int, Record]]:
        for seq, t, kind, data in self._rows("events", "t, kind, data", where, args):
            data = _json(data, _BAD)
            if data is _BAD or not _is_time(t) or not isinstance(kind, str):
                self._warn(f"{self.path.name}: event {seq} is unreadable (skipped)")
                continue
            yield seq, Event(t, kind, data)

    def _traces(self, where: str, args: tuple) -> Iterator[tuple[int, Record]]:
        for seq, t, tid, rank, name, comp, blob, analysis in self._rows(
                "traces", "t, trace_id, rank, name, compression, data, analysis", where, args):
            try:
                if not (_is_time(t) and isinstance(rank, int) and isinstance(blob, bytes)):
                    raise ValueError("damaged row")
                an = None if analysis is None else _json(analysis, _BAD)
                yield seq, Trace(t, str(tid), rank, str(name), unpack_trace(str(comp), blob),
                                 None if an is _BAD or not isinstance(an, dict) else an)
            except (RecordingError, ValueError, zlib.error, MemoryError) as e:
                self._warn(f"{self.path.name}: trace {name!r} unreadable ({_line(e)})")

    def records(self, t0: float = -math.inf, t1: float = math.inf, *, after_seq: int = -1,
                upto_seq: int | None = None, kinds: tuple[str, ...] = ("samples", "events", "traces"),
                with_seq: bool = False) -> Iterator[Any]:
        """Records with t0 <= t <= t1 in the order the session saw them (their seq).

        after_seq / upto_seq bound the seq range; kinds picks among samples, events and traces.
        """
        where, args = "t >= ? AND t <= ?", (_f(t0), _f(t1))
        if after_seq >= 0:
            where += " AND seq > ?"
            args = (*args, after_seq)
        if upto_seq is not None:
            where += " AND seq <= ?"
            args = (*args, upto_seq)
        sources = {"samples": self._samples, "events": self._events, "traces": self._traces}
        merged = heapq.merge(*(sources[k](where, args) for k in kinds), key=lambda x: x[0])
        for seq, rec in merged:
            yield (seq, rec) if with_seq else rec

    def events(self, kind: str | None = None) -> list[Event]:
        evs = [r for _, r in self._events("1=1", ())]
        return [e for e in evs if kind is None or e.kind == kind]  # type: ignore[union-attr]

    def traces(self) -> list[Trace]:
        return [r for _, r in self._traces("1=1", ())]  # type: ignore[misc]

    def seq_at(self, t: float) -> int:
        """The seq of the first record at or after time t (-1 before everything)."""
        best = None
        for table in ("samples", "events", "traces"):
            if table not in self._tables:
                continue
            try:
                # A damaged row may hold anything: only an integer seq counts.
                scope, extra = self._scope(table)
                row = self.db.execute(f"SELECT seq FROM {table} WHERE t >= ? AND typeof(seq) = 'integer' "
                                      f"AND {scope} ORDER BY t LIMIT 1", (_f(t), *extra)).fetchone()
            except _DB_ERRORS:
                continue
            if row is not None:
                best = row[0] if best is None else min(best, row[0])
        return -1 if best is None else best - 1

    def close(self) -> None:
        self.db.close()
        self._drop_copy()

    def __enter__(self) -> "RecordingReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_BAD = object()


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _json(value: Any, bad: Any) -> Any:
    """A stored JSON text as a value; `bad` for anything that is not (wrong type, damaged, too deep)."""
    if not isinstance(value, (str, bytes)):
        return bad
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return bad


def _is_time(t: Any) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)


def _schema_number(v: Any, path: Path) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise RecordingError(f"{path}: meta.schema_version is {str(v)[:40]!r}, not a number: "
                             "not a specdecode-tune recording")
    try:
        return int(v or 0)
    except (ValueError, OverflowError):
        raise RecordingError(f"{path}: meta.schema_version is {str(v)[:40]!r}, not a number: "
                             "not a specdecode-tune recording") from None


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _uri_path(p: Path) -> str:
    # A file name with ?, # or % must not be read as URI syntax.
    from urllib.parse import quote
    return quote(str(p.resolve()))


def _f(x: float) -> float:
    # SQLite compares REAL with +-inf correctly, but Python's inf must be passed as a float.
    return float(x)
