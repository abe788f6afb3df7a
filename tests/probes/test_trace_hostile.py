"""Hostile trace files: deep nesting, wrong types, NaN/negative durations, rank files of different
captures, FIFOs, and a fuzz of the reader (only TraceFormatError may come out, memory bounded).
Real files on disk, the real `analyze` command."""

from __future__ import annotations

import gzip
import json
import os
import threading
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.trace_analysis import TraceAnalysisError, analyze_file, analyze_path
from probes.trace_stream import TraceFormatError, TraceReader
from tuner.cli import main

# The fuzz runs under a fixed seed (derandomize: CI sees the same 10 000 examples every run).
FUZZ = settings(max_examples=10_000, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
FUZZ_MEMORY = 64 << 20


def span(name: str, ts: float, dur: float, tid=1) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def op(ts: float, dur: float, tid=1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input Dims": [[4, 4], [4, 4]]}}


def cpu_trace(n: int = 4, extra: list | None = None, meta: dict | None = None) -> dict:
    evs = []
    for i in range(n):
        t = 1000.0 * i
        evs += [span("draft", t, 200), op(t + 10, 50), span("step[VERIFY bs=1]", t + 300, 300), op(t + 310, 100)]
    return {"schemaVersion": 1, **(meta or {}), "traceEvents": evs + (extra or [])}


def write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def analyze(capsys, path) -> tuple[int, str, str]:
    rc = main(["analyze", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("where", ["events", "meta", "args"])
def test_deep_nesting_is_one_line(tmp_path, capsys, where):
    deep = "[" * 100_000 + "]" * 100_000
    if where == "events":
        text = '{"traceEvents": [' + deep + "]}"
    elif where == "meta":
        text = '{"deviceProperties": ' + deep + ', "traceEvents": []}'
    else:
        text = '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1, "args": ' + deep + "}]}"
    rc, out, err = analyze(capsys, write(tmp_path / "deep.json", text))
    assert rc == 1 and err.count("\n") == 1 and "nested too deeply" in err and "Traceback" not in err


def test_wrong_types_are_skipped_not_a_traceback(tmp_path, capsys):
    bad = [{"ph": "X", "cat": "cpu_op", "name": ["x"], "pid": {"a": 1}, "tid": [1, 2], "ts": 5, "dur": 1},
           {"ph": "X", "cat": "user_annotation", "name": "draft", "tid": {"t": 1}, "ts": 1, "dur": 2, "args": "nope"},
           {"ph": "X", "cat": "kernel", "name": 3, "tid": [7], "ts": "x", "dur": 1},
           {"ph": "X", "cat": "kernel", "name": "k", "pid": [0], "tid": [7], "ts": 10, "dur": 1,
            "args": {"correlation": [1]}},
           {"ph": "X", "cat": "cuda_runtime", "tid": None, "ts": 10, "dur": 1, "args": {"correlation": 2 ** 80}},
           {"ph": "f", "cat": "ac2g", "id": 2 ** 90, "ts": 1}, {"ph": ["X"], "cat": None}, [1, 2], "str"]
    rc, out, err = analyze(capsys, write(tmp_path / "types.json", cpu_trace(extra=bad)))
    assert rc == 0 and "Traceback" not in err and "4 iterations" in out


def test_nan_infinite_and_negative_durations_are_left_out_with_a_warning(tmp_path, capsys):
    # json.dumps writes NaN / Infinity literals, as Python-made traces can hold.
    doc = cpu_trace(extra=[{**op(100, 1), "dur": float("nan")}, op(150, -40.0), {**op(160, 1), "dur": float("inf")},
                           {**op(170, 1), "ts": float("-inf")}])
    rc, out, err = analyze(capsys, write(tmp_path / "bad.json", json.dumps(doc)))
    assert rc == 0 and "nan" not in out.lower().replace("a nan,", "") and "inf" not in out.replace("infinite", "")
    assert "warning: rank 0: 4 events with a NaN, infinite or negative ts/dur were left out" in out
    assert "-" not in "".join(ln.split("ms/iter")[-1] for ln in out.splitlines() if "busy" in ln)


def rank_file(d: Path, rank: int, world: int, base_ns: int, capture: str = "cap") -> Path:
    meta = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}, "baseTimeNanoseconds": base_ns}
    return write(d / f"{capture}-TP-{rank}.trace.json", cpu_trace(meta=meta))


def test_rank_files_of_different_captures_are_warned_about(tmp_path, capsys):
    a = tmp_path / "a"
    a.mkdir()
    rank_file(a, 0, 2, 1_764_000_000_000_000_000)
    rank_file(a, 1, 2, 1_764_000_900_000_000_000)          # 900 s later: another capture
    rc, out, err = analyze(capsys, a)
    assert rc == 0 and "look like different captures" in out
    b = tmp_path / "b"
    b.mkdir()
    rank_file(b, 0, 2, 1_764_000_000_000_000_000)
    rank_file(b, 7, 2, 1_764_000_000_500_000_000)          # rank 7 of a world of 2
    rc, out, err = analyze(capsys, b)
    assert rc == 0 and "ranks [7] are outside the world size 2" in out
    c = tmp_path / "c"
    c.mkdir()
    rank_file(c, 0, 4, 1_764_000_000_000_000_000)
    rank_file(c, 1, 8, 1_764_000_000_000_000_000)
    rc, out, err = analyze(capsys, c)
    assert rc == 0 and "disagree on the world size" in out
    d = tmp_path / "d"
    d.mkdir()
    for r in (0, 1, 3):
        rank_file(d, r, 4, 1_764_000_000_000_000_000)
    rc, out, err = analyze(capsys, d)
    assert rc == 0 and "ranks [2] of a world of 4 are missing" in out


def test_a_fifo_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "x.trace.json"
    os.mkfifo(fifo)
    done = threading.Event()
    result: list = []

    def go() -> None:
        result.append(analyze(capsys, fifo))
        done.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    if not done.wait(60):
        # Unblock the reader stuck in open() so the test process can end, then fail.
        with open(fifo, "w"):
            pass
        pytest.fail("analyze blocked on a FIFO")
    rc, out, err = result[0]
    assert rc == 1 and err.count("\n") == 1 and "not a regular file" in err
    with pytest.raises(TraceFormatError, match="FIFO"):
        list(TraceReader(fifo).events())


def test_fast_and_careful_paths_agree_on_a_large_trace(tmp_path):
    # Big enough for many fast chunks, with events the fast path refuses (NaN literal, a `},{`
    # inside a string, args not an object) spread through it.
    evs = []
    for i in range(3000):
        e = op(10.0 * i, 1.0)
        if i % 500 == 7:
            e["name"] = 'tricky},{"ph":"X"}'
        if i % 700 == 3:
            e["args"] = "not an object"
        evs.append(e)
    text = json.dumps({"traceEvents": evs, "traceName": "t"}, indent=1)
    text = text.replace('"dur": 1.0', '"dur": NaN', 1)
    p = tmp_path / "big.json.gz"
    with gzip.open(p, "wt") as f:
        f.write(text)
    expected = json.loads(text)["traceEvents"]
    got = list(TraceReader(p, chunk_chars=8192).events())
    assert json.dumps(got, allow_nan=True) == json.dumps(expected, allow_nan=True)
    recs = list(TraceReader(p, chunk_chars=8192).records())
    assert [r.name for r in recs] == [e["name"] for e in expected]
    assert [r.args.correlation if r.args else None for r in recs] == [None] * len(expected)


# -- the fuzz ------------------------------------------------------------------------------------------

SEED = json.dumps(cpu_trace(n=2, extra=[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5,
                                         "dur": 2, "args": {"correlation": 3}},
                                        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                                         "tid": 1, "ts": 4, "dur": 1, "args": {"correlation": 3}},
                                        {"ph": "s", "cat": "ac2g", "id": 3, "ts": 4, "tid": 1}],
                          meta={"distributedInfo": {"rank": 0, "world_size": 1}}), indent=1).encode()
SEED_GZ = gzip.compress(SEED, 1)
TOKENS = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"NaN", b"-Infinity", b"1e999", b"null", b"true",
          b'"traceEvents"', b'"ts"', b'"dur"', b'"args"', b'"tid"', b"[" * 3000, b"\xff\xfe", b"\x00", b"\x1f\x8b",
          b"99999999999999999999999", b"-1", b'"\\ud800"']
edit = st.tuples(st.integers(0, len(SEED)), st.integers(0, 40),
                 st.one_of(st.sampled_from(TOKENS), st.binary(max_size=12)))


@FUZZ
@given(gz=st.booleans(), edits=st.lists(edit, max_size=4), cut=st.one_of(st.none(), st.integers(0, len(SEED))))
def test_fuzz_the_trace_reader_raises_only_its_own_error(tmp_path_factory, gz, edits, cut):
    data = bytearray(SEED)
    for pos, drop, ins in edits:
        data[pos:pos + drop] = ins
    raw = bytes(data[:cut] if cut is not None else data)
    if gz:
        raw = gzip.compress(raw, 1)
        if cut is not None and edits:
            raw = raw[: max(0, len(raw) - edits[0][1])]
    path = _fuzz_path(tmp_path_factory)
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        try:
            list(TraceReader(path, chunk_chars=64).records())
            analyze_file(path)
        except (TraceFormatError, TraceAnalysisError) as e:
            assert "\n" not in str(e)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= FUZZ_MEMORY


_FUZZ_DIR: list[Path] = []


def _fuzz_path(factory) -> Path:
    if not _FUZZ_DIR:
        _FUZZ_DIR.append(factory.mktemp("fuzz"))
    return _FUZZ_DIR[0] / "x-TP-0.trace.json"
