"""Every read from a server is bounded (D3, D5, D11, D13, D18): the HTTP client and the live backend
against the hostile server (hostile_server.py), on real sockets."""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from tests.harness import wait_until
from tests.hostile.hostile_server import HostileServer
from tuner.backends.http import BadAnswer, HttpClient, ServerError, ServerSlow
from tuner.backends.promtext import parse_metrics, tail_counts
from tuner.backends.sglang import SGLangBackend
from tuner.core.clock import ManualClock
from tuner.core.events import EventKind
from tuner.core.session import Session


def _peak_mb(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak / 2**20


def test_endless_body_stops_at_the_cap(hostile):
    s = hostile(metrics="endless")
    http = HttpClient(s.url)
    caught = []

    def read():
        with pytest.raises(BadAnswer) as e:
            http.get_text("/metrics")
        caught.append(str(e.value))

    assert _peak_mb(read) < 64
    assert "body too large" in caught[0] and "16 MB" in caught[0]
    http.close()


def test_compression_bomb_stops_at_the_cap_after_decompression(hostile):
    s = hostile(metrics="bomb", info="bomb", bomb_mb=64)
    http = HttpClient(s.url)
    for path in ("/metrics", "/server_info"):
        caught = []

        def read():
            with pytest.raises(BadAnswer) as e:
                http.get_bytes(path)
            caught.append(str(e.value))

        assert _peak_mb(read) < 64
        assert "body too large" in caught[0]
    http.close()


@pytest.mark.parametrize("path", ["/metrics", "/server_info"])
def test_trickling_body_ends_at_the_deadline(hostile, path):
    s = hostile(metrics="trickle", info="trickle", trickle_s=0.2)
    http = HttpClient(s.url, deadline=1.0)
    with pytest.raises(ServerSlow) as e:
        http.get_bytes(path)
    assert "no full answer within 1 s" in str(e.value)
    http.close()


@pytest.mark.parametrize("path", ["/metrics", "/server_info"])
def test_headers_sent_a_byte_at_a_time_end_at_the_deadline(hostile, path):
    # Every byte comes well inside httpx's per-read timeout (3 s), so only the request's own
    # deadline can end it; the server would go on for hours.
    s = hostile(metrics="slow_headers", info="slow_headers", trickle_s=0.2)
    http = HttpClient(s.url, deadline=1.0)
    errors: list[Exception] = []

    def two_requests() -> None:
        for _ in range(2):                 # a fresh connection, then whatever the pool kept
            try:
                http.get_bytes(path)
            except Exception as e:         # noqa: BLE001 - the assertions below say which
                errors.append(e)

    # In a thread, so that a client without the deadline fails this test instead of hanging the suite.
    worker = threading.Thread(target=two_requests, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the client was still reading headers after 60 s"
    assert len(errors) == 2 and all(isinstance(e, ServerSlow) for e in errors), errors
    assert all("no full answer within 1 s" in str(e) for e in errors)
    http.close()


def test_a_healthy_server_still_answers_through_the_deadline_transport(hostile):
    s = hostile()
    http = HttpClient(s.url, deadline=1.0)
    for _ in range(3):                     # pooled connections carry no deadline of their own
        assert "sglang:gen_throughput" in http.get_text("/metrics")
        assert http.get_json("/server_info")
    http.close()


def test_deep_json_is_one_line(hostile):
    s = hostile(info="deep")
    http = HttpClient(s.url)
    with pytest.raises(BadAnswer) as e:
        http.get_json("/server_info")
    assert "nested deeper than 64 levels" in str(e.value) and "\n" not in str(e.value)
    http.close()


@pytest.mark.parametrize("url", ["http://[::1:31999", "http://127.0.0.1:31999 x", "ftp://host/", "http://"])
def test_malformed_url_is_one_line(url):
    from tuner.backends import connect
    with pytest.raises(ServerError) as e:
        connect(url)
    assert "\n" not in str(e.value)


def test_huge_label_does_not_size_an_allocation(hostile):
    s = hostile(metrics="huge_label")
    text = HttpClient(s.url).get_text("/metrics")
    tail = []
    assert _peak_mb(lambda: tail.extend(tail_counts(parse_metrics(text), "specdecode:accept_position_total"))) < 8
    assert tail == [5.0]


def _wired(url: str):
    backend = SGLangBackend(url, deadline=1.0)
    clock = ManualClock(1000.0)
    session = Session(backend, clock=clock)
    backend.attach(session.bus, clock)
    return backend, session


def test_slow_endpoint_is_degraded_and_a_poll_error_not_a_disconnect(hostile):
    s = hostile(metrics="trickle", trickle_s=0.2)
    backend, session = _wired(s.url)
    try:
        backend.poll_server_info()
        backend.poll_metrics()
        session.tick()
        kinds = [e.kind for e in session.store.events()]
        assert EventKind.DISCONNECTED not in kinds
        assert EventKind.DEGRADED in kinds
        errors = session.store.events(EventKind.POLL_ERROR)
        assert errors and errors[-1].data["endpoint"] == "/metrics"
        conn = session.connection()
        assert conn.state == "degraded" and conn.text().startswith("degraded (GET ")
        s.modes["/metrics"] = "ok"                  # it answers in time again
        backend.poll_metrics()
        session.tick()
        assert session.connection().text() == "connected"
    finally:
        backend.stop()


def test_sse_lines_are_bounded():
    from tuner.backends.load import StreamTooLong, sse_lines

    assert list(sse_lines([b"data: 1\r\nda", b"ta: 2\n\n", b"tail"])) == ["data: 1", "data: 2", "", "tail"]
    with pytest.raises(StreamTooLong):
        list(sse_lines(iter([b"x" * 1000] * 10), limit=4000))


@pytest.mark.parametrize("mode", ["endless_line", "endless_error"])
def test_load_driver_against_an_endless_generate(hostile, mode):
    from tuner.backends.load import LoadDriver
    from tuner.core.bus import Bus
    from tuner.core.clock import SystemClock

    s = hostile()
    s.generate = mode
    bus = Bus()
    load = LoadDriver(s.url, bus, SystemClock(), [{"text": "x"}], concurrency=1)
    tracemalloc.start()
    try:
        load.start()
        errors: list = []

        def reported() -> list:
            errors.extend(r for r in bus.drain() if getattr(r, "kind", None) == EventKind.LOAD_ERROR)
            return errors

        wait_until(reported, 120, "the load driver to report the endless stream")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        load.stop()
    msg = errors[0].data["error"]
    assert ("SSE line longer than 4 MB" in msg) if mode == "endless_line" else msg.startswith("/generate: HTTP 500: eee")
    assert peak < 64 * 2**20


def test_trace_download_is_capped_and_checks_the_disk(hostile, tmp_path, monkeypatch):
    import probes.capture as C

    s = hostile()
    name = "p-TP-0.trace.json.gz"
    s.modes[f"/specdecode/traces/{name}"] = "endless"
    cap = C.TraceCapture(s.url, remote=True)
    monkeypatch.setattr(C, "MAX_TRACE_BYTES", 4 * 2**20)
    with pytest.raises(C.CaptureError, match="over the"):
        cap._download(name, tmp_path / name)
    assert list(tmp_path.iterdir()) == []                # no partial file left behind
    monkeypatch.setattr(C, "MIN_FREE_BYTES", 2**62)      # a disk that is (nearly) full
    with pytest.raises(C.CaptureError, match="not enough free disk space"):
        cap._download(name, tmp_path / name)
    assert list(tmp_path.iterdir()) == []
    cap.close()


def test_oversized_endpoint_is_degraded_not_connected(hostile):
    """The red team's N16: a /metrics body over the cap showed "connected"; it is degraded, as a
    slow one is, and connected again once it answers within the cap."""
    s = hostile(metrics="endless")
    backend, session = _wired(s.url)
    try:
        backend.poll_server_info()
        backend.poll_metrics()
        session.tick()
        kinds = [e.kind for e in session.store.events()]
        assert EventKind.DEGRADED in kinds and EventKind.DISCONNECTED not in kinds
        conn = session.connection()
        assert conn.state == "degraded" and "body too large" in conn.text(), conn.text()
        s.modes["/metrics"] = "ok"
        backend.poll_metrics()
        session.tick()
        assert session.connection().text() == "connected"
    finally:
        backend.stop()
