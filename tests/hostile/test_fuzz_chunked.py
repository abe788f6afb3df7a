"""Fuzz test (Hypothesis, 10 000 examples under the derandomized `ci-fuzz` profile) of the server's
chunked-body reader (refengine.server.wire.read_chunked), and the red team's N2 against the real
server: a negative chunk size made it buffer until the client closed (300 MB sent, +280 MB RSS).

The reader's properties, on any bytes: it returns a body no longer than the cap or raises
BadRequest (400/413) with one line; it never calls read() without a size or with one past the cap;
and a well-formed encoding of any body within the cap decodes to that body."""

from __future__ import annotations

import io
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refengine.server.inputs import BadRequest
from refengine.server.wire import MAX_LINE, read_chunked

from .test_fuzz_readers import CI

CAP = 64


class Wire(io.BytesIO):
    """The bytes a client sent; records every read's size (a read without one would buffer all)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int | None] = []

    def read(self, size: int | None = -1) -> bytes:
        self.sizes.append(size)
        assert size is not None and 0 <= size <= CAP, f"read({size})"
        return super().read(size)

    def readline(self, size: int | None = -1) -> bytes:
        assert size is not None and 0 < size <= MAX_LINE + 1, f"readline({size})"
        return super().readline(size)


FRAGMENTS = [b"0", b"1", b"5", b"a", b"F", b"40", b"41", b"-1", b"-0", b"+5", b"0x5", b" ", b"\t", b"\r\n", b"\n",
             b"\r", b";", b";ext=1", b"ffffffffffffffff", b"1" * 17, b"\x00", b"g", b"\xff", b"x" * 70,
             b"abc", b"Trailer: v\r\n", b"\r\n\r\n", b"1_0", b"\xd9\xa3"]
# One draw of bytes per example, each byte picking a fragment (cheap enough for 10 000 on 2 cores).
RAW = st.binary(max_size=40).map(lambda b: b"".join(FRAGMENTS[x % len(FRAGMENTS)] for x in b))


def encode(chunks: list[bytes], ext: bool, lf_only: bool) -> bytes:
    eol = b"\n" if lf_only else b"\r\n"
    out = b"".join(b"%x%s%s%s%s" % (len(c), b";x=y" if ext else b"", eol, c, eol) for c in chunks if c)
    return out + b"0" + eol + eol


def _check(raw: bytes) -> bytes | None:
    w = Wire(raw)
    try:
        body = read_chunked(w, CAP)
    except BadRequest as e:
        assert e.status in (400, 413) and "\n" not in str(e)
        return None
    assert len(body) <= CAP
    return body


@CI
@given(st.one_of(RAW, st.binary(max_size=80)))
def test_fuzz_chunked_reader_on_any_bytes(raw):
    _check(raw)


@CI
@given(st.lists(st.binary(max_size=24), max_size=6), st.booleans(), st.booleans(), st.integers(0, 200))
def test_fuzz_chunked_round_trip_and_cuts(chunks, ext, lf_only, cut):
    raw = encode(chunks, ext, lf_only)
    body = b"".join(chunks)
    got = _check(raw)
    if len(body) <= CAP:
        assert got == body
    else:
        assert got is None
    _check(raw[:cut])              # a connection that ends anywhere: a clean 400, never a hang on read


@pytest.mark.parametrize("raw, status", [
    (b"-1\r\n" + b"A" * 100, 400),                     # N2: read(-1) buffered to EOF
    (b"-0\r\n\r\n", 400),
    (b"0x10\r\n", 400),
    (b"41\r\n", 413),                                  # past the cap: refused before any data is read
    (b"40\r\n" + b"A" * 64 + b"\r\n1\r\nA\r\n0\r\n\r\n", 413),
    (b"5\r\nABCDEFG\r\n0\r\n\r\n", 400),               # a chunk longer than its size
    (b"5\r\nAB", 400),                                 # the connection ended inside a chunk
])
def test_chunked_reader_refuses(raw, status):
    with pytest.raises(BadRequest) as e:
        read_chunked(Wire(raw), CAP)
    assert e.value.status == status


def test_negative_chunk_size_is_refused_at_once(tp2_server):
    """The red team's N2 reproduction, shortened: the server answers 400 as soon as it has read the
    size line (before the fix it called read(-1) and buffered everything the client sent until the
    client closed, so no answer came while the connection stayed open)."""
    host, port = tp2_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nAAAA")
        reply = b""
        while b"\r\n\r\n" not in reply:
            data = s.recv(65536)       # a socket timeout here is the defect: the server is still reading
            if not data:
                break
            reply += data
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"chunk size" in reply or b"Connection: close" in reply
