"""Fuzz of the recording reader: a real recording with bytes changed, cut, or pages swapped must
give RecordingError (one line) or records with one-line problems, never another exception, and
never much memory. Fixed seed (derandomize) so CI sees the same 10 000 files every run."""

from __future__ import annotations

import gzip
import os
import json
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.core.records import Event, Sample, Trace
from tuner.recording import Recorder, RecordingError, open_recording

FUZZ = settings(max_examples=int(os.environ.get("SPECDECODE_FUZZ_EXAMPLES", 10_000)), derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
FUZZ_MEMORY = 64 << 20


def _seed() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "seed.db"
        r = Recorder(p, {"backend": "refengine", "url": "http://127.0.0.1:1", "server_info": {"model": "tiny"}})
        trace = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1,
                                                           "dur": 2, "tid": 1}]}).encode())
        r.write([Sample(100.0 + i / 4, f"s{i % 5}", float(i)) for i in range(60)]
                + [Event(100.0 + i, "note", {"text": f"n{i}", "x": [i, {"y": i}]}) for i in range(6)]
                + [Trace(120.0, "cap", 0, "cap-TP-0.trace.json.gz", trace, {"mode": "cpu"})])
        r.close()
        return p.read_bytes()


SEED = _seed()
PAGE = int.from_bytes(SEED[16:18], "big")
edit = st.tuples(st.integers(0, len(SEED) - 1), st.integers(0, 64),
                 st.one_of(st.binary(min_size=1, max_size=16),
                           st.sampled_from([b"\x00" * 8, b"\xff" * 8, b"SQLite format 3\x00", b"\x0d", b"\x05"])))


@FUZZ
@given(edits=st.lists(edit, max_size=4), cut=st.one_of(st.none(), st.integers(0, len(SEED))),
       swap=st.one_of(st.none(), st.tuples(st.integers(0, len(SEED) // PAGE - 1),
                                           st.integers(0, len(SEED) // PAGE - 1))))
def test_fuzz_the_recording_reader_raises_only_its_own_error(tmp_path_factory, edits, cut, swap):
    data = bytearray(SEED)
    if swap is not None:
        a, b = swap
        pa, pb = bytes(data[a * PAGE:(a + 1) * PAGE]), bytes(data[b * PAGE:(b + 1) * PAGE])
        data[a * PAGE:(a + 1) * PAGE], data[b * PAGE:(b + 1) * PAGE] = pb, pa
    for pos, n, ins in edits:
        data[pos:pos + len(ins)] = ins if n % 2 else ins * max(1, n // 8)
    if cut is not None:
        del data[cut:]
    path = _path(tmp_path_factory)
    path.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        try:
            with open_recording(path) as r:
                for _ in r.records():      # samples, events and traces, merged by seq
                    pass
                r.seq_at(110.0)
                assert all("\n" not in w for w in r.warnings)
        except RecordingError as e:
            assert "\n" not in str(e)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= FUZZ_MEMORY


_DIR: list[Path] = []


def _path(factory) -> Path:
    if not _DIR:
        _DIR.append(factory.mktemp("recfuzz"))
    return _DIR[0] / "r.db"
