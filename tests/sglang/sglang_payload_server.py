"""STAND-IN for an SGLang 0.5.23 server with our plugin, serving the recorded-shape payloads.

For testing the operator side (attach → readings → control) against SGLang's HTTP surface, which
cannot be run here. A real HTTP server on loopback that serves exactly the fixtures in
fixtures/, made to move with time the way a decoding server does:

  /metrics            counters advance at the t0 → t1 fixture rates (per second), gauges are t1's
  /server_info        server_info_adaptive.json, internal_states[0] carrying the active tier
  /model_info, /health, /generate (generate_response.json; SSE from generate_stream.txt)
  /specdecode/streams, /specdecode/phases   records from phases_reply.json's template, 22/s
  /set_internal_state specdecode_timers → [true]; specdecode_num_steps → [true] for a captured
                      tier 1..5 (the active tier, the metrics gauges and new records follow, with a
                      new epoch), -1 → [true]; anything else → [false], as SGLang answers

--no-plugin: SGLang without our plugin, launched without --speculative-adaptive and without the
device timer: metrics_no_plugin.txt (static), server_info_static.json, /specdecode/* 404, and
/set_internal_state answers [false] to the plugin's keys.

--server-info FILE: serve that /server_info instead (the launch-shape tests write one whose
internal_states come from the plugin's code on SGLang's real adaptive classes); a step pin is then
taken exactly for the tiers its `specdecode_pinnable_steps` lists, as the plugin takes them.
--no-metrics: launched without --enable-metrics: /metrics answers FastAPI's 404.

Run: python sglang_payload_server.py --port P [--no-plugin] [--server-info FILE] [--no-metrics]
(prints "ready" when listening).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

FIX = Path(__file__).resolve().parent / "fixtures"
ITER_PER_S = 22.0
CAPTURED = (1, 2, 3, 4, 5)
_SAMPLE = re.compile(r"^(?P<name>[^{\s]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[m.group("name") + (m.group("labels") or "")] = float(m.group("value"))
    return out


class State:
    def __init__(self, plugin: bool = True, info: Path | None = None, metrics: bool = True) -> None:
        self.plugin = plugin
        self.serve_metrics = metrics
        self.t_start = time.monotonic()
        self.t0 = (FIX / ("metrics_t0.txt" if plugin else "metrics_no_plugin.txt")).read_text()
        self.t1 = (FIX / ("metrics_t1.txt" if plugin else "metrics_no_plugin.txt")).read_text()
        self.v0, self.v1 = _samples(self.t0), _samples(self.t1)
        self.info = json.loads((info or FIX / ("server_info_adaptive.json" if plugin else "server_info_static.json")).read_text())
        published = self.info["internal_states"][0].get("specdecode_pinnable_steps")
        self.captured = tuple(int(k) for k in published["steps"]) if published else CAPTURED
        self.template = json.loads((FIX / "phases_reply.json").read_text())["records"]
        self.steps = self.info["internal_states"][0]["speculative_num_steps"]
        self.epoch = self.template[0]["epoch"]
        self.lease_until = 0.0
        self.lock = threading.Lock()
        self.changes: list[tuple[float, int, int]] = []      # (elapsed, seq from, steps)

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def metrics(self) -> str:
        dt = self.elapsed()
        out = []
        for line in self.t1.splitlines():
            m = _SAMPLE.match(line)
            if line.startswith("#") or not m:
                out.append(line)
                continue
            key = m.group("name") + (m.group("labels") or "")
            v1, v0 = self.v1[key], self.v0.get(key, self.v1[key])
            if key.startswith("sglang:spec_num_steps"):
                v = float(self.steps)
            elif key.startswith("sglang:spec_num_draft_tokens"):
                v = float(self.steps + 1)
            elif m.group("name").endswith("_total"):
                v = v0 + (v1 - v0) * dt           # counters: the fixture's per-second rate
            else:
                v = v1
            out.append(f"{key} {v!r}")
        return "\n".join(out) + "\n"

    def phases(self, after: int, limit: int) -> dict:
        newest = int(self.elapsed() * ITER_PER_S)
        first = max(after + 1, newest - 4095, 1)
        recs = []
        now = time.time()
        for seq in range(first, min(newest, after + limit) + 1):
            base = dict(self.template[seq % len(self.template)])
            steps, epoch = self._config_at(seq)
            accepted = [min(a, steps) for a in base["accepted"]]   # never more drafts than steps
            base.update(seq=seq, t=now - (newest - seq) / ITER_PER_S, steps=steps,
                        num_draft_tokens=steps + 1, epoch=epoch, accepted=accepted,
                        committed=sum(accepted) + len(accepted))
            recs.append(base)
        return {"next": recs[-1]["seq"] if recs else min(after, newest),
                "dropped": max(0, first - after - 1), "records": recs}

    def _config_at(self, seq: int) -> tuple[int, int]:
        steps, epoch = self.template[0]["steps"], self.template[0]["epoch"]
        for i, (_, from_seq, s) in enumerate(self.changes):
            if seq >= from_seq:
                steps, epoch = s, self.template[0]["epoch"] + i + 1
        return steps, epoch

    def set_internal_state(self, args: dict) -> list[bool]:
        ok = True
        for key, value in args.items():
            if key == "specdecode_timers" and isinstance(value, (int, float)) and 0 <= value <= 86400:
                continue
            if key == "specdecode_num_steps" and value in (-1, *self.captured):
                continue
            ok = False                             # SGLang: "Updating {key} is not supported."
        if not ok:
            return [False]
        if "specdecode_timers" in args:
            self.lease_until = self.elapsed() + float(args["specdecode_timers"])
        n = args.get("specdecode_num_steps")
        if n is not None and n != -1 and n != self.steps:
            with self.lock:
                self.steps = int(n)
                self.info["internal_states"][0].update(speculative_num_steps=self.steps,
                                                       speculative_num_draft_tokens=self.steps + 1)
                self.changes.append((self.elapsed(), int(self.elapsed() * ITER_PER_S) + 1, self.steps))
        return [True]


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self):
            u = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(u.query).items()}
            if u.path == "/health":
                return self._send(200, b"")
            if u.path == "/metrics" and not state.serve_metrics:
                return self._json(404, {"detail": "Not Found"})
            if u.path == "/metrics":
                return self._send(200, state.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            if u.path in ("/server_info", "/get_server_info"):
                return self._json(200, state.info)
            if u.path in ("/model_info", "/get_model_info"):
                return self._send(200, (FIX / "model_info.json").read_bytes())
            if u.path.startswith("/specdecode/") and not state.plugin:
                return self._json(404, {"detail": "Not Found"})
            if u.path == "/specdecode/streams":
                return self._json(200, {"plugin": "specdecode", "version": "1",
                                        "streams": [{"dp": 0, "rank": r} for r in range(8)]})
            if u.path == "/specdecode/phases":
                try:
                    after, limit = int(q.get("after", 0)), int(q.get("limit", 1024))
                except ValueError:
                    return self._json(400, {"error": {"message": "bad query", "type": "invalid_request",
                                                      "code": 400}})
                return self._json(200, state.phases(after, max(1, min(limit, 4096))))
            return self._json(404, {"detail": "Not Found"})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                return self._json(400, {"detail": "bad json"})
            u = urlparse(self.path)
            if u.path == "/set_internal_state":
                args = body.get("server_args") if isinstance(body, dict) else None
                if not isinstance(args, dict):
                    return self._json(422, {"detail": "server_args required"})
                if not state.plugin:      # SGLang alone ignores the plugin's keys: [false]
                    return self._json(200, [False])
                return self._json(200, state.set_internal_state(args))
            if u.path == "/generate":
                if body.get("stream"):
                    return self._send(200, (FIX / "generate_stream.txt").read_bytes(), "text/event-stream")
                return self._send(200, (FIX / "generate_response.json").read_bytes())
            return self._json(404, {"detail": "Not Found"})

    return Handler


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--no-plugin", action="store_true")
    p.add_argument("--server-info", type=Path, default=None)
    p.add_argument("--no-metrics", action="store_true")
    args = p.parse_args()
    state = State(plugin=not args.no_plugin, info=args.server_info, metrics=not args.no_metrics)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    print("ready", flush=True)
    server.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
