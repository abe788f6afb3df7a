"""Reading a request body off the wire: Content-Length and chunked transfer coding, each within a cap.

Works on any binary file object with readline(limit) and read(n) (the handler's rfile); raises
BadRequest (400 malformed, 413 too large) and never reads more than the cap plus the framing. Must
not call read() without a size: a body must never be buffered until the client closes.
"""

from __future__ import annotations

import re
from typing import BinaryIO

from refengine.server.inputs import BadRequest

MAX_LINE = 1024                 # a chunk-size line (with extensions) or one trailer line
MAX_TRAILER_BYTES = 16 << 10    # all trailer lines together
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


def too_large(cap: int) -> BadRequest:
    return BadRequest(f"body too large (limit {cap} bytes)", 413)


def read_length(rfile: BinaryIO, header: str | None, cap: int) -> bytes:
    """The body of a request with Content-Length `header` (None: no body)."""
    try:
        length = int(header or 0)
    except ValueError:
        raise BadRequest("bad Content-Length") from None
    if length < 0:
        raise BadRequest(f"bad Content-Length: {length} is negative")
    if length > cap:
        raise too_large(cap)
    return rfile.read(length) if length else b""


def _line(rfile: BinaryIO, what: str) -> bytes:
    """One CRLF- (or LF-) terminated line without its terminator; a longer or unterminated line is a 400."""
    line = rfile.readline(MAX_LINE + 1)
    if not line.endswith(b"\n"):
        if len(line) > MAX_LINE:
            raise BadRequest(f"malformed chunked body: {what} longer than {MAX_LINE} bytes")
        raise BadRequest(f"malformed chunked body: the connection ended inside {what}")
    return line[:-2] if line.endswith(b"\r\n") else line[:-1]


def read_chunked(rfile: BinaryIO, cap: int) -> bytes:
    """The body of a `Transfer-Encoding: chunked` request (RFC 9112 §7.1): each size must be a
    well-formed non-negative hex number, and counts against `cap` before its data is read."""
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = _line(rfile, "a chunk-size line")
        token = size_line.split(b";", 1)[0].strip(b" \t")
        if not _HEX.fullmatch(token):
            raise BadRequest("malformed chunked body: a chunk size must be a hexadecimal number")
        size = int(token, 16)
        if size == 0:
            _trailers(rfile)
            return b"".join(parts)
        if total + size > cap:
            raise too_large(cap)
        data = rfile.read(size)
        if len(data) != size:
            raise BadRequest("malformed chunked body: the connection ended inside a chunk")
        total += size
        parts.append(data)
        if _line(rfile, "a chunk's end") != b"":
            raise BadRequest("malformed chunked body: a chunk is longer than its size")


def _trailers(rfile: BinaryIO) -> None:
    """Skip the trailer section up to its empty line (a client that closes right after the last
    chunk is let off the empty line, as before)."""
    seen = 0
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if line in (b"\r\n", b"\n", b""):
            return
        seen += len(line)
        if not line.endswith(b"\n") or seen > MAX_TRAILER_BYTES:
            raise BadRequest("malformed chunked body: trailers too long")
