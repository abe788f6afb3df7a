"""The streaming chrome-trace reader: equals json.load on any valid trace, one clear error otherwise."""

from __future__ import annotations

import gzip
import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.trace_stream import TraceFormatError, TraceReader

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=False, allow_infinity=False), st.text(alphabet=string.printable + "µé中\"\\", max_size=12),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
events = st.lists(st.dictionaries(st.sampled_from(["ph", "name", "ts", "dur", "cat", "args", "tid"]), values, max_size=6), max_size=12)
META = st.dictionaries(st.sampled_from(["schemaVersion", "deviceProperties", "distributedInfo", "traceName"]), values, max_size=3)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _write(path, text: str, gz: bool) -> None:
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def _document(evs, meta, indent, bare: bool) -> str:
    if bare:
        return json.dumps(evs, indent=indent)
    doc = dict(meta)
    doc["traceEvents"] = evs
    doc.update({"traceName": meta.get("traceName", "x")})
    return json.dumps(doc, indent=indent, ensure_ascii=False)


@SETTINGS
@given(evs=events, meta=META, indent=st.sampled_from([None, 0, 1, 4]), bare=st.booleans(),
       gz=st.booleans(), chunk=st.integers(1, 64))
def test_streamed_events_equal_json_load(tmp_path, evs, meta, indent, bare, gz, chunk):
    path = tmp_path / "t.json"
    _write(path, _document(evs, meta, indent, bare), gz)
    reader = TraceReader(path, chunk_chars=chunk)
    assert list(reader.events()) == evs
    if not bare:
        assert reader.meta["traceName"] == meta.get("traceName", "x")


@SETTINGS
@given(evs=events.filter(lambda e: len(e) > 0), cut=st.floats(0.0, 0.999), gz=st.booleans(), chunk=st.integers(1, 64))
def test_truncated_file_is_one_clean_error(tmp_path, evs, cut, gz, chunk):
    text = _document(evs, {}, 1, False)
    raw = (gzip.compress(text.encode()) if gz else text.encode())
    path = tmp_path / "t.json"
    path.write_bytes(raw[: int(len(raw) * cut)])
    with pytest.raises(TraceFormatError) as e:
        list(TraceReader(path, chunk_chars=chunk).events())
    assert "\n" not in str(e.value) and "t.json" in str(e.value)


@SETTINGS
@given(evs=events, pos=st.floats(0.0, 1.0), junk=st.sampled_from(["}", "]", ":", "x", "{{", ",,", "\"", "[1,}"]))
def test_corrupted_json_is_one_clean_error_or_still_valid(tmp_path, evs, pos, junk):
    text = _document(evs, {}, None, False)
    i = int(len(text) * pos)
    bad = text[:i] + junk + text[i:]
    path = tmp_path / "t.json"
    path.write_text(bad)
    try:
        expected = json.loads(bad)
    except json.JSONDecodeError:
        expected = None
    try:
        got = list(TraceReader(path, chunk_chars=7).events())
    except TraceFormatError as e:
        assert "\n" not in str(e)
        return
    # Whatever the reader accepts must be what a full JSON parse sees (it may accept a trailing comma).
    if expected is not None and isinstance(expected, dict) and isinstance(expected.get("traceEvents"), list):
        assert got == [e for e in expected["traceEvents"] if isinstance(e, dict)]


def test_numbers_split_across_chunks_are_not_cut(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"schemaVersion": 123456789, "a": 0.0, "b": -12.5e+3, "traceEvents": [{"ts": 1234567.25}], "c": 7}')
    for chunk in range(1, 20):
        reader = TraceReader(path, chunk_chars=chunk)
        assert list(reader.events()) == [{"ts": 1234567.25}]
        assert reader.meta == {"schemaVersion": 123456789, "a": 0.0, "b": -12.5e3, "c": 7}


def test_invalid_json_early_in_a_big_file_fails_there(tmp_path):
    path = tmp_path / "t.json"
    good = ",".join('{"ph": "X", "name": "aten::mm", "ts": %d, "dur": 1}' % i for i in range(100_000))
    path.write_text('{"traceEvents": [{"ph": "X", "ts": 1,, "dur": 2}, ' + good + "]}")
    with pytest.raises(TraceFormatError, match=r"invalid JSON .* near character (\d+)") as e:
        list(TraceReader(path, chunk_chars=4096).events())
    # the reader stops at the error instead of buffering megabytes looking for the value's end
    assert int(str(e.value).rsplit(" ", 1)[1]) < 100


@pytest.mark.parametrize("content, why", [
    (b"", "empty file"),
    (b"{", "truncated"),
    (b"hello", "not a chrome trace"),
    (b'{"schemaVersion": 1}', "no traceEvents"),
    (b'{"traceEvents": 5}', "no traceEvents"),
    (b'{"traceEvents": [{"a": 1} {"b": 2}]}', "expected"),
    (b"\x1f\x8b\x08\x00garbage", "gzip"),
    (b"\xff\xfe\x00", "UTF-8"),
])
def test_bad_files_name_the_problem(tmp_path, content, why):
    path = tmp_path / "bad.trace.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=why):
        list(TraceReader(path).events())


def test_trailing_comma_as_some_exporters_write(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"a": 1},\n]}')
    assert list(TraceReader(path).events()) == [{"a": 1}]
