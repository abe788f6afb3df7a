"""A HOSTILE server for the client-hardening tests only: an SGLang-shaped HTTP server (stdlib, real
sockets on loopback) whose /metrics and /server_info misbehave on purpose.

Each endpoint has a mode (set before or while a client talks to it):
  ok          a normal answer (SGLang 0.5.23's shape, no plugin)
  endless     a chunked body that never ends (memory)
  trickle     a chunked body of one byte every `trickle_s` seconds (deadlines)
  slow_headers  the status line and headers, one byte every `trickle_s` seconds (deadlines before the body)
  bomb        a small gzip body that inflates to `bomb_mb` MB (caps after decompression)
  huge_label  /metrics: one sample with k="20000000" (allocations sized by a label)
  deep        100 000 nested brackets (recursion)
  wrong_types /server_info: every field of the wrong type; /metrics: a non-number value
  control     escape sequences in every string the client shows (terminal injection)
  secret      /server_info's launch_command holds `--api-key SECRET` (and an abbreviation)
POST /generate (the load driver) answers an SSE line that never ends, or an endless 500 body.
It is not a product component and knows nothing of decoding. Handlers end when the server stops.
"""

from __future__ import annotations

import json
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "sglang" / "fixtures" / "server_info_static.json"
ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mEVIL\x1b[0m"
SECRET = "SECRETKEY123"
OK_METRICS = ('# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput{tp_rank="0"} 100.0\n'
              '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank="0"} 2.0\n')


def _gzip_of_zeros(mb: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(z.compress(block) for _ in range(mb)) + z.flush()


class _QuietServer(ThreadingHTTPServer):
    """A client that drops a kept-alive connection (the point of most tests here) is not an error
    worth a traceback on the test run's output; anything else still prints."""

    def handle_error(self, request: object, client_address: object) -> None:
        import sys
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class HostileServer:
    def __init__(self, metrics: str = "ok", info: str = "ok", trickle_s: float = 0.3, bomb_mb: int = 256) -> None:
        self.modes = {"/metrics": metrics, "/server_info": info}
        self.trickle_s = trickle_s
        self.bomb_mb = bomb_mb
        self._bomb: bytes | None = None
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0
        self.requests: dict[str, int] = {}
        self.generate = "endless_line"      # POST /generate: endless_line | endless_error

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bomb(self) -> bytes:
        if self._bomb is None:
            self._bomb = _gzip_of_zeros(self.bomb_mb)
        return self._bomb

    def server_info(self, mode: str) -> dict:
        info = json.loads(FIXTURE.read_text())
        if mode == "wrong_types":
            info.update(version={"x": 1}, served_model_name=["a", {"b": 2}], tp_size="two", dp_size={},
                        internal_states="nope", model_path=7, speculative_algorithm=3.5, startup_time="soon")
        elif mode == "control":
            info["served_model_name"] = ESC
            info["version"] = "0.5.23" + ESC
            info["internal_states"][0]["speculative_num_steps"] = ESC
        elif mode == "secret":
            info["launch_command"] += f" --api-key {SECRET} --admin-api-ke={SECRET}x"
        elif mode == "braces":
            info["version"] = "0.5.23-{build}"
        return info

    def metrics(self, mode: str) -> str:
        if mode == "huge_label":
            return (OK_METRICS + "# TYPE specdecode:accept_position_total counter\n"
                    'specdecode:accept_position_total{k="0"} 5\n'
                    'specdecode:accept_position_total{k="20000000"} 1\n')
        if mode == "wrong_types":
            return OK_METRICS + 'sglang:num_queue_reqs{tp_rank="0"} many\n'
        if mode == "control":
            return OK_METRICS + f'sglang:{ESC} 1\n'
        return OK_METRICS

    def start(self) -> "HostileServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def send(self, body: bytes, ctype: str, status: int = 200, extra: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def chunked(self, chunk: bytes, pause: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while not server._stopping.is_set():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                        if pause:
                            server._stopping.wait(pause)
                except OSError:
                    pass
                self.close_connection = True

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                server.requests[path] = server.requests.get(path, 0) + 1
                mode = server.modes.get(path)
                if mode is None:
                    return self.send(b'{"detail": "Not Found"}', "application/json", 404)
                if mode == "endless":
                    line = b'sglang:junk{a="%d"} 1\n'
                    return self.chunked(b"".join(line % i for i in range(5000)), 0.0)
                if mode == "trickle":
                    return self.chunked(b"#" if path == "/metrics" else b" ", server.trickle_s)
                if mode == "slow_headers":
                    return self.slow_head()
                if mode == "bomb":
                    ctype = "text/plain" if path == "/metrics" else "application/json"
                    return self.send(server.bomb(), ctype, extra={"Content-Encoding": "gzip"})
                if mode == "deep":
                    body = '{"internal_states": ' + "[" * 100000 + "]" * 100000 + ', "version": "1"}'
                    return self.send(body.encode(), "application/json")
                if path == "/server_info":
                    return self.send(json.dumps(server.server_info(mode)).encode(), "application/json")
                return self.send(server.metrics(mode).encode(), "text/plain; version=0.0.4")

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                if self.path.startswith("/generate") and server.generate == "endless_line":
                    return self.chunked(b"data: " + b"x" * 65536, 0.0)    # a line that never ends
                if self.path.startswith("/generate") and server.generate == "endless_error":
                    self.send_response(500)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    return self.chunked_body(b"e" * 65536)
                self.send(b"[false]", "application/json")

            def slow_head(self) -> None:
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Pad: " + b"a" * 100000
                try:
                    for i in range(len(head)):
                        if server._stopping.is_set():
                            break
                        self.wfile.write(head[i:i + 1])
                        self.wfile.flush()
                        server._stopping.wait(server.trickle_s)
                except OSError:
                    pass
                self.close_connection = True

            def chunked_body(self, chunk: bytes) -> None:
                try:
                    while not server._stopping.is_set():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:
                    pass
                self.close_connection = True

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, name="hostile-server", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> "HostileServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
