"""Streaming reader for chrome-trace JSON files (plain or gzip): yields one trace event at a time.

A torch-profiler trace is `{"schemaVersion": ..., "traceEvents": [event, ...], ...}` (or a bare
`[event, ...]` array). Traces of a GPU server run to hundreds of MB, so this never holds the file:
it decodes the `traceEvents` array element by element with the stdlib's C scanner over a sliding
text buffer. Memory is bounded by the largest single event (capped at MAX_EVENT_CHARS).

Every malformation (truncated gzip, invalid JSON, no traceEvents) becomes one `TraceFormatError`
with a one-line message. This module must not interpret events; `trace_analysis` does.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHUNK_CHARS = 1 << 20
# One event larger than this is not a trace event but a broken file; refuse instead of buffering it.
MAX_EVENT_CHARS = 64 << 20

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
_SCAN = json.JSONDecoder().scan_once


class TraceFormatError(ValueError):
    """The file is not a readable chrome trace; the message is one line naming the file."""


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

    # -- public ---------------------------------------------------------------------------------
    def events(self) -> Iterator[dict]:
        """Yield every event dict of `traceEvents`; raise TraceFormatError on any malformation."""
        try:
            with _open_text(self.path) as f:
                self._file = f
                yield from self._document()
        except TraceFormatError:
            raise
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
            value = self._value()
            if isinstance(value, dict):
                yield value
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

    # -- the buffer -----------------------------------------------------------------------------
    def _fill(self) -> None:
        assert self._file is not None
        chunk = self._file.read(self._chunk)
        if not chunk:
            self._eof = True
            return
        if self._pos > len(self._buf) // 2:
            self._consumed += self._pos
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
    # Decide by magic bytes, not by name: SGLang writes .json.gz, torch's exporter may write plain.
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")
