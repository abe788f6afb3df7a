"""A server's trace is data: whatever it holds, a capture keeps the rank files and reports the
analysis error instead of raising (the TUI's capture key and `record --capture-trace-every` run
`capture_into` on a worker thread that must survive it). Real HTTP capture from the stand-in
server of tests/probes/test_capture.py; the session is a stand-in holding only what capture_into
reads (the backend's URL, the clock, the bus)."""

from __future__ import annotations

import gzip
import json

import pytest

import probes.trace_analysis
from tests.probes.test_capture import ContractServer
from tuner.core.capture import capture_into
from tuner.core.events import EventKind
from tuner.core.records import Event, Trace


class _Session:
    """What capture_into uses of a Session: the backend's url and key, the clock, the bus."""

    def __init__(self, url: str):
        self.backend = type("B", (), {"url": url, "api_key": None})()
        self.records: list = []

    def now(self) -> float:
        return 1.0

    def put(self, record) -> None:
        self.records.append(record)


@pytest.fixture
def bad_server(tmp_path):
    made = []

    def make(payload: bytes) -> ContractServer:
        d = tmp_path / f"srv{len(made)}"
        d.mkdir()
        made.append(ContractServer(d, trace_bytes=gzip.compress(payload)))
        return made[-1]
    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("payload", [
    b'{"traceEvents": [{"ph": "X", "name": "draft", "ts": "soon", "dur": [1]}]}',   # wrong types
    b'{"traceEvents": ' + b'[' * 5000 + b']' * 5000 + b'}',                          # deep nesting
    b'not json at all',
])
def test_a_bad_trace_is_an_analysis_error_and_the_files_are_kept(bad_server, payload, tmp_path):
    srv = bad_server(payload)
    session = _Session(srv.url)
    got = capture_into(session, num_steps=2, timeout_s=30, keep_in=tmp_path / "kept")
    traces = [r for r in session.records if isinstance(r, Trace)]
    events = [r for r in session.records if isinstance(r, Event) and r.kind == EventKind.TRACE_CAPTURED]
    assert len(traces) == 2 and len(events) == 1
    assert got.analysis is None and got.analysis_error
    assert events[0].data["analysis_error"] == got.analysis_error
    assert "\n" not in got.analysis_error
    # The rank files stay in a folder named by the capture, which the event names (for Perfetto).
    folder = tmp_path / "kept" / got.trace_id
    assert got.folder == str(folder) == events[0].data["folder"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(got.files)
    assert all((folder / name).read_bytes() == t.data for name, t in zip(got.files, traces))


def test_a_bug_a_trace_trips_in_the_analyser_is_reported_not_raised(bad_server, monkeypatch, tmp_path):
    srv = bad_server(json.dumps({"traceEvents": []}).encode())

    def trips(paths):
        raise KeyError("a field the analyser assumed")
    monkeypatch.setattr(probes.trace_analysis, "analyze_paths", trips)
    got = capture_into(_Session(srv.url), num_steps=2, timeout_s=30, keep_in=tmp_path / "kept")
    assert got.analysis is None and got.analysis_error.startswith("analysis failed: KeyError")
