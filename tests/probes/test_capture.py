"""Trace capture over real HTTP on loopback.

The server here is a stand-in that speaks the documented contract (SGLang's /server_info and
/start_profile, our engine's /specdecode/traces): it writes real trace files (the SGLang-shaped
fixtures) in two halves a moment apart, as an exporter writing in place does. The end-to-end test
against the real engine (`serve --tp-size 2`) is test_capture_engine.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from probes.capture import CaptureError, TraceCapture, is_loopback
from probes.trace_analysis import analyze_paths

FIXTURES = Path(__file__).parent / "fixtures" / "sglang_gpu"


class ContractServer:
    def __init__(self, server_dir: Path, tp_size: int = 2, refuse: bool = False, write: bool = True,
                 extra_names: tuple[str, ...] = (), trace_bytes: bytes | None = None):
        """trace_bytes: what every rank file holds instead of the SGLang-shaped fixture."""
        self.server_dir, self.tp_size, self.refuse, self.write = server_dir, tp_size, refuse, write
        self.trace_bytes = trace_bytes
        self.extra_names = extra_names
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output clean
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.auth.append(self.headers.get("Authorization"))
                if self.path == "/server_info":
                    return self._send(200, json.dumps({"tp_size": outer.tp_size, "version": "0.5.23"}).encode())
                if self.path == "/specdecode/traces":
                    files = [{"name": p.name, "size": p.stat().st_size, "rank": 0, "profile_id": "x"}
                             for p in sorted(outer.server_dir.glob("*.trace.json.gz"))]
                    files += [{"name": n, "size": 10, "rank": 0, "profile_id": "x"} for n in outer.extra_names]
                    return self._send(200, json.dumps({"files": files}).encode())
                if self.path.startswith("/specdecode/traces/"):
                    name = unquote(self.path[len("/specdecode/traces/"):])
                    p = outer.server_dir / name
                    if "/" in name or not p.is_file():
                        return self._send(404, b'{"error": {"message": "no such trace"}}')
                    return self._send(200, p.read_bytes(), "application/gzip")
                self._send(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                if outer.refuse:
                    return self._send(500, b"Internal Server Error: profiling already running\n", "text/plain")
                out = Path(body.get("output_dir") or outer.server_dir)
                if outer.write:
                    threading.Thread(target=outer._export, args=(out, body["profile_id"]), daemon=True).start()
                self._send(200, b"Start profiling.\n", "text/plain")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _export(self, out: Path, pid: str) -> None:
        time.sleep(0.2)
        for rank in range(self.tp_size):
            data = self.trace_bytes if self.trace_bytes is not None else \
                (FIXTURES / f"1764490000.5-TP-{rank}.trace.json.gz").read_bytes()
            target = out / f"{pid}-TP-{rank}.trace.json.gz"
            with open(target, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                time.sleep(0.3)  # a reader that trusts existence alone would take half a file
                f.write(data[len(data) // 2:])

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    servers = []

    def make(**kw) -> ContractServer:
        d = tmp_path / f"server{len(servers)}"
        d.mkdir()
        s = ContractServer(d, **kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_local_capture_waits_for_complete_files(server, tmp_path):
    srv = server()
    events = []
    cap = TraceCapture(srv.url, on_progress=events.append, poll_s=0.05, api_key="k3y")
    res = cap.capture(tmp_path / "traces", num_steps=3, timeout_s=20)
    assert not res.remote and [p.name[-19:] for p in res.files] == ["-TP-0.trace.json.gz", "-TP-1.trace.json.gz"]
    for rank, p in enumerate(res.files):
        assert p.read_bytes() == (FIXTURES / f"1764490000.5-TP-{rank}.trace.json.gz").read_bytes()
    body = srv.bodies[0]
    assert body["num_steps"] == 3 and body["with_stack"] is False and body["record_shapes"] is False
    assert body["output_dir"] == str((tmp_path / "traces").resolve()) and body["profile_id"] == res.profile_id
    assert set(srv.auth) == {"Bearer k3y"}
    stages = [e.stage for e in events]
    assert stages[0] == "starting" and "waiting" in stages and stages[-1] == "done"
    assert events[-1].files_ready == 2 and events[-1].to_dict()["files_expected"] == 2
    assert analyze_paths(res.files).to_dict()["across"]["aligned_iterations"] == 2


def test_remote_capture_downloads_by_name(server, tmp_path):
    srv = server(extra_names=("../../escape-TP-0.trace.json.gz", "x-TP-1.trace.json"))
    cap = TraceCapture(srv.url, remote=True, poll_s=0.05)
    res = cap.capture(tmp_path / "dl", num_steps=2, timeout_s=20, profile_id="cap.1")
    assert res.remote and "output_dir" not in srv.bodies[0]
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["cap.1-TP-0.trace.json.gz", "cap.1-TP-1.trace.json.gz"]
    assert all(p.parent == tmp_path / "dl" for p in res.files)
    assert res.files[1].read_bytes() == (FIXTURES / "1764490000.5-TP-1.trace.json.gz").read_bytes()
    assert not (tmp_path / "escape-TP-0.trace.json.gz").exists()


def test_refused_start_is_one_line(server, tmp_path):
    srv = server(refuse=True)
    with pytest.raises(CaptureError, match=r"^/start_profile refused \(500\): Internal Server Error") as e:
        TraceCapture(srv.url).capture(tmp_path, num_steps=1)
    assert "\n" not in str(e.value)


def test_idle_server_times_out_with_a_hint(server, tmp_path):
    srv = server(write=False)
    events = []
    with pytest.raises(CaptureError, match="is the server decoding"):
        TraceCapture(srv.url, poll_s=0.05, on_progress=events.append).capture(tmp_path, num_steps=4, timeout_s=0.4)
    assert events[-1].stage == "failed"


def test_dead_server(tmp_path):
    srv = ContractServer(tmp_path)
    url = srv.url
    srv.close()
    with pytest.raises(CaptureError, match="ConnectError"):
        TraceCapture(url).capture(tmp_path, num_steps=1)


def test_bad_arguments(server, tmp_path):
    srv = server()
    with pytest.raises(CaptureError, match="num_steps"):
        TraceCapture(srv.url).capture(tmp_path, num_steps=0)
    with pytest.raises(CaptureError, match="profile_id"):
        TraceCapture(srv.url).capture(tmp_path, profile_id="../x")


def test_loopback_detection():
    assert is_loopback("http://127.0.0.1:30000") and is_loopback("http://localhost:1")
    assert is_loopback("http://[::1]:8000") and not is_loopback("http://10.0.0.5:30000")


def test_sglang_file_names_are_recognised_and_nothing_else():
    from probes.capture import _is_capture_file

    for name in ("p1-TP-0.trace.json.gz", "prefix-p1-TP-3-DP-1-PP-0.trace.json.gz", "p1-TP-0-DECODE.trace.json.gz"):
        assert _is_capture_file(name, "p1"), name
    for name in ("../p1-TP-0.trace.json.gz", "p1-TP-0.trace.json", "xp1-TP-0.trace.json.gz", "p1-TP-0.trace.json.gz/x"):
        assert not _is_capture_file(name, "p1"), name
