"""Streaming reader for chrome-trace JSON files (plain or gzip): yields one trace event at a time.

A torch-profiler trace is `{"schemaVersion": ..., "traceEvents": [event, ...], ...}` (or a bare
`[event, ...]` array). Traces of a GPU server run to hundreds of MB, so this never holds the file:
it reads a sliding text buffer of CHUNK_CHARS and decodes the `traceEvents` array a chunk at a time.

Fast path: the chunk up to its last `},{` between two events is decoded at once by msgspec (a
compiled JSON decoder; `records()` decodes straight into `TraceEvent` structs and skips the fields
the analyser never reads, which are most of a kineto trace's bytes). Chosen over orjson because it
decodes into typed structs and skips unknown keys, where orjson must build every dict. A cut that
falls inside an event (a `},{` in a nested value or a string) makes the chunk invalid JSON, so a
wrong cut can never be accepted. Anything the fast path refuses (a bad cut, NaN literals, wrong
types, broken JSON) is read again element by element with the standard library's scanner, which
also finds the exact place of an error. Memory is bounded by the chunk, and one event by
MAX_EVENT_CHARS.

Every malformation (truncated gzip, invalid JSON, nesting deeper than the decoders go, no
traceEvents, a FIFO or device instead of a file) becomes one `TraceFormatError` with a one-line
message. This module must not interpret events; `trace_analysis` does.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any, Optional, Union

import msgspec

CHUNK_CHARS = 1 << 20
# One event larger than this is not a trace event but a broken file; refuse instead of buffering it.
MAX_EVENT_CHARS = 64 << 20

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
_SCAN = json.JSONDecoder().scan_once
# Where one event ends and the next begins: `}` `,` `{` with whitespace between.
_BOUNDARY = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*\{")
_FAST_MIN_CHARS = 4096      # below this the element-by-element path is as quick


class TraceFormatError(ValueError):
    """The file is not a readable chrome trace; the message is one line naming the file."""


class _Args(msgspec.Struct, gc=False):
    correlation: Any = None


class TraceEvent(msgspec.Struct, gc=False):
    """The fields of a trace event that the analyser reads. The decoder checks the types; an event
    with other types goes through `of`, which keeps what fits and drops the rest, so the analyser
    never sees a list where it expects a number or a thread id."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: Optional[float] = None
    dur: float = 0.0
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    id: Any = None
    args: Optional[_Args] = None

    @staticmethod
    def of(d: dict) -> "TraceEvent":
        """From a generic event dict of any types: wrong-typed fields become their defaults (or,
        for pid/tid, their text), `args` that is not an object counts as none."""
        a = d.get("args")
        dur = _float(d.get("dur", 0.0))
        return TraceEvent(_str(d.get("ph")), _str(d.get("cat")), _str(d.get("name", "")),
                          _float(d.get("ts")), math.nan if dur is None else dur,
                          _ident(d.get("pid")), _ident(d.get("tid")), d.get("id"),
                          _Args(a.get("correlation")) if isinstance(a, dict) else None)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else "" if v is None else "?" + repr(v)[:80]


def _float(v: Any) -> float | None:
    if isinstance(v, float):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v) if -(1 << 1000) < v < (1 << 1000) else math.inf
    return None


def _ident(v: Any) -> int | str | None:
    if v is None or isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    return "?" + repr(v)[:80]


_DICTS = msgspec.json.Decoder()
_TYPED = msgspec.json.Decoder(list[TraceEvent])


class TraceReader:
    """Iterate a trace's events; after iteration `meta` holds the other top-level keys.

    Example:
        reader = TraceReader("x-TP-0.trace.json.gz")
        for event in reader.events():
            ...
        reader.meta.get("distributedInfo")
    """

    def __init__(self, path: str | Path, chunk_chars: int = CHUNK_CHARS) -> None:
        self.path = Path(path)
        self.meta: dict[str, Any] = {}
        self._chunk = chunk_chars
        self._buf = ""
        self._pos = 0
        self._consumed = 0  # characters dropped from the front of the buffer
        self._eof = False
        self._file: io.TextIOBase | None = None
        self._typed = False
        self._slow_until = -1   # buffer position up to which the fast path failed once

    # -- public ---------------------------------------------------------------------------------
    def events(self) -> Iterator[dict]:
        """Yield every event dict of `traceEvents`; raise TraceFormatError on any malformation."""
        self._typed = False
        return chain.from_iterable(self._run())

    def records(self) -> Iterator[TraceEvent]:
        """Yield every event of `traceEvents` as a TraceEvent (only the fields the analyser reads)."""
        return chain.from_iterable(self.record_batches())

    def record_batches(self) -> Iterator[list[TraceEvent]]:
        """records() in lists of up to a chunk's worth (the analyser's loop; no generator per event)."""
        self._typed = True
        return self._run()

    def _run(self) -> Iterator[Any]:
        try:
            with _open_text(self.path) as f:
                self._file = f
                yield from self._document()
                # Read to the end: a gzip stream cut after the JSON's last byte is still truncated.
                while f.read(self._chunk):
                    pass
        except TraceFormatError:
            raise
        except RecursionError:
            raise TraceFormatError(f"{self.path.name}: invalid JSON (nested too deeply)") from None
        except MemoryError:
            raise TraceFormatError(f"{self.path.name}: too large to read") from None
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise TraceFormatError(f"{self.path.name}: truncated or corrupt gzip ({e})") from None
        except UnicodeDecodeError:
            raise TraceFormatError(f"{self.path.name}: not UTF-8 text (is it a trace file?)") from None
        except OSError as e:
            raise TraceFormatError(f"{self.path.name}: cannot read ({e.strerror or e})") from None

    # -- the document ---------------------------------------------------------------------------
    def _document(self) -> Iterator[dict]:
        c = self._peek()
        if c == "":
            self._fail("empty file")
        if c == "[":
            yield from self._array()
            return
        if c != "{":
            self._fail("not a chrome trace (expected a JSON object or array)")
        self._pos += 1
        found = False
        while True:
            c = self._peek()
            if c == "}":
                break
            key = self._value()
            if not isinstance(key, str):
                self._fail("invalid JSON (object key is not a string)")
            self._expect(":")
            if key == "traceEvents" and self._peek() == "[":
                found = True
                yield from self._array()
            else:
                self.meta[key] = self._value()
            c = self._peek()
            if c == ",":
                self._pos += 1
            elif c != "}":
                self._fail_at(c, "',' or '}'")
        if not found:
            self._fail("no traceEvents array")

    def _array(self) -> Iterator[dict]:
        self._pos += 1  # '['
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            batch = self._fast()
            if batch is not None:
                yield batch
            else:
                value = self._value()
                if isinstance(value, dict):
                    yield [TraceEvent.of(value) if self._typed else value]
            c = self._peek()
            if c == ",":
                self._pos += 1
                if self._peek() == "]":  # a trailing comma, as some exporters write
                    self._pos += 1
                    return
            elif c == "]":
                self._pos += 1
                return
            else:
                self._fail_at(c, "',' or ']'")

    def _fast(self) -> list | None:
        """Decode the events from here to the last event boundary in the buffer at once, or None
        (then the caller reads one element the careful way)."""
        if self._pos < self._slow_until:
            return None
        if len(self._buf) - self._pos < self._chunk and not self._eof:
            self._fill()
        if self._peek() != "{":
            return None
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _FAST_MIN_CHARS:
            return None
        cut = buf.rfind("}", pos, len(buf))
        while cut > pos and not _BOUNDARY.match(buf, cut):
            cut = buf.rfind("}", pos, cut)
        if cut <= pos:
            return None
        text = "[" + buf[pos:cut + 1] + "]"
        try:
            batch = _TYPED.decode(text) if self._typed else _DICTS.decode(text)
        except msgspec.ValidationError:
            # Valid JSON with unexpected types (args a string, ...): generic, then converted.
            try:
                batch = [TraceEvent.of(v) for v in _DICTS.decode(text) if isinstance(v, dict)]
            except (msgspec.DecodeError, RecursionError):
                batch = None
        except (msgspec.DecodeError, RecursionError):
            batch = None
        if batch is None:
            self._slow_until = cut + 1     # read this stretch element by element, then try again
            return None
        self._pos = cut + 1
        return batch if self._typed else [v for v in batch if isinstance(v, dict)]

    # -- the buffer -----------------------------------------------------------------------------
    def _fill(self) -> None:
        assert self._file is not None
        chunk = self._file.read(self._chunk)
        if not chunk:
            self._eof = True
            return
        if self._pos > len(self._buf) // 2:
            self._consumed += self._pos
            self._slow_until -= self._pos
            self._buf = self._buf[self._pos:]
            self._pos = 0
        self._buf += chunk

    def _peek(self) -> str:
        """Skip whitespace; return the next character, or '' at the end of the file."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if self._eof:
                return ""
            self._fill()

    def _expect(self, ch: str) -> None:
        c = self._peek()
        if c != ch:
            self._fail_at(c, repr(ch))
        self._pos += 1

    def _value(self) -> Any:
        if self._peek() == "":
            self._fail("truncated (the file ends inside the JSON)")
        while True:
            try:
                value, end = _SCAN(self._buf, self._pos)
            except RecursionError:
                self._fail("invalid JSON (nested too deeply)")
            except StopIteration as e:
                value, end = None, -1
                self._fail_if_wrong_before_end(e.value, "")
            except json.JSONDecodeError as e:
                value, end = None, -1
                self._fail_if_wrong_before_end(e.pos, e.msg)
            # A value that reaches the end of the buffer may continue in the next chunk: a number
            # cut in two ("0." + "5") decodes "successfully", so a number is final only once a
            # character that cannot continue it follows.
            if end != -1 and (self._eof or (end < len(self._buf) and not (
                    isinstance(value, (int, float)) and not isinstance(value, bool)
                    and _NUMBER_TAIL.fullmatch(self._buf, end)))):
                self._pos = end
                return value
            if self._eof:
                if end == -1 and self._looks_cut():
                    self._fail("truncated (the file ends inside the JSON)")
                self._fail("invalid JSON")
            if len(self._buf) - self._pos > MAX_EVENT_CHARS:
                self._fail(f"invalid JSON (a value longer than {MAX_EVENT_CHARS} characters)")
            self._fill()

    def _fail_if_wrong_before_end(self, pos: int, msg: str) -> None:
        # An error well before the end of the buffer cannot be cured by reading more (a cut
        # literal, number or escape is short), so fail now instead of buffering the rest of the file.
        if not msg.startswith("Unterminated string") and pos < len(self._buf) - 64:
            self._pos = pos
            self._fail(f"invalid JSON ({msg or 'expected a value'})")

    def _looks_cut(self) -> bool:
        """At EOF: is the failed value simply unfinished (vs. wrong)? Balance brackets and quotes."""
        depth, in_str, esc = 0, False, False
        for ch in self._buf[self._pos:]:
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "[{":
                depth += 1
            elif ch in "]}":
                depth -= 1
        return in_str or depth > 0

    def _fail_at(self, got: str, wanted: str) -> None:
        if got == "":
            self._fail("truncated (the file ends inside the JSON)")
        self._fail(f"invalid JSON (expected {wanted}, found {got!r})")

    def _fail(self, what: str) -> None:
        offset = self._consumed + self._pos
        raise TraceFormatError(f"{self.path.name}: {what} near character {offset}")


def iter_trace_events(path: str | Path) -> Iterator[dict]:
    """Yield the events of one chrome-trace file (see TraceReader)."""
    return TraceReader(path).events()


def _open_text(path: Path) -> io.TextIOBase:
    # A FIFO or a device would block or never end: refuse anything but a regular file, before open().
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise TraceFormatError(f"{path.name}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise TraceFormatError(f"{path.name}: {what}, not a trace file")
    # Decide by magic bytes, not by name: SGLang writes .json.gz, torch's exporter may write plain.
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")
