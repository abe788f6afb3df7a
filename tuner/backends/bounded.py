"""Bounded reading of one HTTP answer: a byte cap (after decompression too) and an overall deadline.

A server can send a body that never ends, one that trickles in a byte a second, or a small gzip
that inflates to gigabytes. This module reads a streamed httpx response so that none of those can
take more than `cap` bytes of memory or more than the deadline of wall time, and it decodes
gzip/deflate itself with `max_length`, so a compression bomb is stopped at the cap instead of inflated
whole. It also bounds what JSON may look like (nesting depth). Must not retry, sleep or keep state.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import httpx

KB, MB = 1024, 1024 * 1024
STEP = 1 * MB          # inflate at most this much at a time (memory: the body so far plus one step)
# Nesting deeper than this is not what any server we read sends; deeper would also reach Python's
# recursion limit in json and in everything that walks the result.
MAX_JSON_DEPTH = 64


class BodyTooLarge(Exception):
    """The body (decoded) went past its cap."""


class DeadlineExceeded(Exception):
    """The answer did not arrive in full before the request's deadline."""


class BadEncoding(Exception):
    """A Content-Encoding we do not decode, or a corrupt compressed body."""


class TooDeep(ValueError):
    """JSON nested deeper than MAX_JSON_DEPTH."""


@dataclass(frozen=True)
class Limits:
    """What one request may take: `cap` decoded bytes, `deadline_s` seconds from sending it."""

    cap: int
    deadline_s: float


def _decoder(encoding: str):  # noqa: ANN202
    """A zlib decompressor for the Content-Encoding, None for identity; BadEncoding otherwise."""
    enc = [e.strip().lower() for e in encoding.split(",") if e.strip() and e.strip().lower() != "identity"]
    if not enc:
        return None
    if len(enc) > 1:
        raise BadEncoding(f"stacked content encodings ({encoding!r:.40}) are not read")
    if enc[0] in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc[0] == "deflate":
        return zlib.decompressobj()     # zlib-wrapped, as the HTTP spec says (raw deflate is retried below)
    raise BadEncoding(f"content encoding {enc[0]!r:.30} is not read (ask for gzip or none)")


def _set_read_timeout(resp: httpx.Response, seconds: float) -> None:
    """Shorten the socket read timeout of the rest of this response to what the deadline leaves.

    httpcore looks the read timeout up in the request's extensions at every read, so a trickling
    body is cut at the deadline rather than one full read timeout after it. Best effort: when the
    dict is not there the deadline is still checked between chunks.
    """
    timeouts = resp.request.extensions.get("timeout")
    if isinstance(timeouts, dict):
        timeouts["read"] = max(0.01, seconds)


def read_body(resp: httpx.Response, limits: Limits, started: float, clock=time.monotonic) -> bytes:  # noqa: ANN001
    """The decoded body of a streamed response, or BodyTooLarge / DeadlineExceeded / BadEncoding."""
    declared = resp.headers.get("content-length")
    encoding = resp.headers.get("content-encoding", "")
    if declared and declared.isdigit() and not encoding and int(declared) > limits.cap:
        raise BodyTooLarge(f"says it is {int(declared)} bytes")
    dec = _decoder(encoding)
    out = bytearray()
    deadline = started + limits.deadline_s

    def take(data: bytes) -> None:
        out.extend(data)
        if len(out) > limits.cap:
            raise BodyTooLarge(f"more than {limits.cap} bytes")

    chunks: Iterator[bytes] = resp.iter_raw()
    for chunk in chunks:
        left = deadline - clock()
        if left <= 0:
            raise DeadlineExceeded()
        _set_read_timeout(resp, left)
        if dec is None:
            take(chunk)
            continue
        data = chunk
        while data:
            try:
                # max_length: never inflate more than the cap allows, whatever the ratio.
                piece = dec.decompress(data, min(STEP, limits.cap + 1 - len(out)))
            except zlib.error:
                if encoding.strip().lower() == "deflate" and not out:
                    dec = zlib.decompressobj(-zlib.MAX_WBITS)   # some servers send raw deflate
                    piece = dec.decompress(data, min(STEP, limits.cap + 1 - len(out)))
                else:
                    raise BadEncoding(f"corrupt {encoding.strip()} body") from None
            take(piece)
            data = dec.unconsumed_tail
    if clock() > deadline:
        raise DeadlineExceeded()
    if dec is not None:
        try:
            take(dec.flush(limits.cap + 1 - len(out)) if hasattr(dec, "flush") else b"")
        except zlib.error:
            raise BadEncoding(f"corrupt {encoding.strip()} body") from None
    return bytes(out)


def json_depth_ok(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `obj` nests at most `limit` containers deep (iterative: no recursion of our own)."""
    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in x)
    return True


def loads_bounded(data: bytes | str) -> Any:
    """json.loads that turns nesting deeper than MAX_JSON_DEPTH into TooDeep (never RecursionError).

    Raises json.JSONDecodeError / UnicodeDecodeError for what is not JSON text.
    """
    try:
        obj = json.loads(data)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not json_depth_ok(obj):
        raise TooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return obj
