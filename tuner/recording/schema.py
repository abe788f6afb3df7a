"""The recording file format: one SQLite file, versioned. Only DDL, constants and codecs live here.

Tables: meta (header key -> JSON), series (id, name), samples (seq, t, series_id, value; NaN stored as
NULL), events (seq, t, kind, data JSON), traces (seq, t, trace_id, rank, name, compression, data BLOB,
analysis JSON). `seq` is one counter across the three record tables, so the exact order the session
saw is kept. The file says what it is with PRAGMA application_id and its schema with user_version
(and meta.schema_version). Bump SCHEMA_VERSION for any change a v1 reader could misread.

Schema 2 (fleet recordings): samples, events and traces carry `server`, the fleet member's name ('' in
a one-server recording); a fleet's header lists its members under FLEET_KEY and keeps each one's own
header under SERVER_KEY + name. A schema-1 file has no server column and reads as one server.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from typing import Any

from tuner.core.redact import redact_url

SCHEMA_VERSION = 2
FLEET_KEY = "fleet"          # [{name, url}, ...] in a fleet recording's meta
SERVER_KEY = "server/"       # + name: that member's header (backend, url, server_info, ...)
APPLICATION_ID = 0x53445455          # "SDTU": specdecode-tune

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS samples (seq INTEGER PRIMARY KEY, t REAL NOT NULL, series_id INTEGER NOT NULL,
                                    value REAL, server TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS samples_by_t ON samples (t);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, t REAL NOT NULL, kind TEXT NOT NULL,
                                   data TEXT NOT NULL, server TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS events_by_t ON events (t);
CREATE TABLE IF NOT EXISTS traces (seq INTEGER PRIMARY KEY, t REAL NOT NULL, trace_id TEXT NOT NULL,
                                   rank INTEGER NOT NULL, name TEXT NOT NULL, compression TEXT NOT NULL,
                                   data BLOB NOT NULL, analysis TEXT, server TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS traces_by_t ON traces (t);
"""


class RecordingError(Exception):
    """A recording that cannot be (fully) used; the message is one line for people."""


def dumps(value: Any) -> str:
    """JSON for a recording's column; a URL's userinfo password never reaches the file (the server
    URL is in the header, the command line and connection events)."""
    return redact_url(json.dumps(value, sort_keys=True, allow_nan=True, default=_default))


def _default(o: Any) -> Any:
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if hasattr(o, "items"):
        return dict(o.items())
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def loads(text: str) -> Any:
    return json.loads(text)


def value_in(v: float) -> float | None:
    return None if math.isnan(v) else v


def value_out(v: float | None) -> float:
    return math.nan if v is None else float(v)


def pack_trace(data: bytes) -> tuple[str, bytes]:
    """(compression, stored bytes): gzip files are kept as the server wrote them, others deflated."""
    if data[:2] == b"\x1f\x8b":
        return "gzip", data
    return "zlib", zlib.compress(data, 6)


def unpack_trace(compression: str, stored: bytes) -> bytes:
    """The trace file's bytes exactly as the server wrote them."""
    if compression == "gzip":
        return bytes(stored)
    if compression == "zlib":
        return zlib.decompress(stored)
    raise RecordingError(f"unknown trace compression {compression!r}")


def trace_text(data: bytes) -> bytes:
    """Decompressed JSON of a trace file (gzip or plain)."""
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
