"""The tuner's phase-stream reader over real loopback HTTP: it skips the server's history (which
arrives 1024 records a page), then hands over new records in order, and survives a bad answer."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from harness import wait_until
from tuner.tuning.phase_feed import HttpPhaseFeed


class Ring:
    """The stream's paging rule: records after SEQ, at most `limit`, `next` = last seq returned."""

    def __init__(self, n: int) -> None:
        self.records = [{"seq": i + 1, "steps": 3} for i in range(n)]
        self.broken = False
        self.lock = threading.Lock()

    def page(self, after: int, limit: int) -> dict:
        with self.lock:
            recs = [r for r in self.records if r["seq"] > after][:limit]
            return {"next": recs[-1]["seq"] if recs else after, "dropped": 0, "records": recs}

    def add(self, k: int) -> None:
        with self.lock:
            base = self.records[-1]["seq"]
            self.records += [{"seq": base + i + 1, "steps": 5} for i in range(k)]


def serve(ring: Ring) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            q = parse_qs(urlparse(self.path).query)
            if ring.broken:
                body, ctype = b"<html>oops</html>", "text/html"
            else:
                body = json.dumps(ring.page(int(q["after"][0]), int(q["limit"][0]))).encode()
                ctype = "application/json"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def wait_for(cond, timeout=30.0):
    return wait_until(cond, timeout, "the feed", interval=0.02)


def test_feed_skips_history_then_streams_new_records():
    ring = Ring(2500)                      # more than two pages of history
    httpd = serve(ring)
    feed = HttpPhaseFeed(f"http://127.0.0.1:{httpd.server_address[1]}", interval=0.02)
    try:
        assert wait_for(lambda: feed._cursor == 2500)
        assert feed.poll() == []
        ring.add(5)
        got: list = []
        assert wait_for(lambda: len(got.extend(feed.poll()) or got) == 5)
        assert [r["seq"] for r in got] == [2501, 2502, 2503, 2504, 2505]
        assert all(r["steps"] == 5 for r in got)
        ring.broken = True
        assert wait_for(lambda: "not JSON" in feed.last_error or "HTML" in feed.last_error)
        assert feed.poll() == []
        ring.broken = False
        ring.add(2)
        got = []
        assert wait_for(lambda: len(got.extend(feed.poll()) or got) == 2)
    finally:
        feed.close()
        httpd.shutdown()
