"""A STAND-IN for an external server, for the core's HTTP tests only.

It is a real HTTP server (stdlib, on loopback, real sockets) that answers with payloads shaped like
SGLang 0.5.23 and `specdecode-tune serve` (sglang-0.5.23.md §1, docs/ARCHITECTURE.md "The phase
stream"). It is not the product's engine and knows nothing of decoding: tests script its counters,
phase records and control replies, and can make it answer HTML, 500s or garbage, or vanish. The
integration tests against the real `serve` live in test_against_serve.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# SGLang 0.5.23's own live keys (scheduler_components/internal_state.py `_update_handlers`), which
# it takes without the plugin; the plugin adds its two. Any other key refuses the whole body.
SGLANG_UPDATABLE = ("pp_max_micro_batch_size", "speculative_accept_threshold_single",
                    "speculative_accept_threshold_acc")
PLUGIN_UPDATABLE = ("specdecode_num_steps", "specdecode_timers")


class StandIn:
    def __init__(self, kind: str = "refengine", plugin: bool = False, adaptive: bool = False,
                 api_key: str | None = None) -> None:
        self.kind = kind
        self.plugin = plugin
        self.adaptive = adaptive
        self.api_key = api_key
        self.mode = "ok"                 # ok | html | 500 | garbage
        self.config = {"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded", "epoch": 1}
        self.decode_tokens = 0.0
        self.accept_tail = [0.0, 0.0, 0.0, 0.0]
        self.forward_s = {"eagle_draft": 0.0, "target_verify": 0.0, "eagle_draft_extend": 0.0}
        self.records: list[dict[str, Any]] = []
        self.seq = 0
        self.posts: list[Any] = []
        self.refuse_next: str | None = None
        self.generate_tokens = 5
        self.incremental = False          # stream output ids as deltas (SGLang --incremental-streaming-output)
        self.startup_time = time.time()
        self.state_extra: dict[str, Any] = {}   # more internal_states[0] keys (a pin, adaptive, ...)
        # SGLang's resolved server args its /set_internal_state overrides (launch value 1.0)
        self.overrides: dict[str, Any] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    # -- scripting --------------------------------------------------------------------------------

    def iterate(self, accepted: list[int], phase_ms: dict[str, float] | None = None,
                comm_ms: dict[str, float] | None = None, wall_ms: float = 10.0, t: float | None = None) -> None:
        """One decode iteration of a batch: counters move and a phase record is appended."""
        self.seq += 1
        phase_ms = phase_ms or {"draft": 3.0, "verify": 5.0, "verify_sample": 0.5, "draft_extend": 1.0, "other": 0.5}
        comm_ms = comm_ms or {"draft": 1.0, "verify": 1.5, "verify_sample": 0.0, "draft_extend": 0.2, "other": 0.0}
        self.records.append({
            "seq": self.seq, "t": time.time() if t is None else t, "epoch": self.config["epoch"],
            "steps": self.config["steps"], "topk": self.config["topk"],
            "num_draft_tokens": self.config["num_draft_tokens"], "placement": self.config["placement"],
            "bs": len(accepted), "committed": sum(a + 1 for a in accepted), "wall_ms": wall_ms,
            "phase_ms": phase_ms, "comm_ms": comm_ms, "comm_calls": {p: 1 for p in phase_ms},
            "accepted": accepted, "simulated": False, "emulated_comm": False})
        self.decode_tokens += sum(a + 1 for a in accepted)
        for a in accepted:
            while len(self.accept_tail) <= a:
                self.accept_tail.append(0.0)
            for k in range(a + 1):
                self.accept_tail[k] += 1
        self.forward_s["eagle_draft"] += phase_ms["draft"] / 1e3
        self.forward_s["target_verify"] += phase_ms["verify"] / 1e3

    def server_info(self) -> dict[str, Any]:
        c = self.config
        launch = {"model_path": "tiny-llama", "tp_size": 2, "speculative_algorithm": "EAGLE3",
                  "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                  "api_key": self.api_key}
        state = {**launch, "speculative_num_steps": c["steps"], "speculative_eagle_topk": c["topk"],
                 "speculative_num_draft_tokens": c["num_draft_tokens"], "startup_time": self.startup_time}
        if self.kind == "refengine":
            launch["speculative_draft_placement"] = "sharded"
            state.update(speculative_draft_placement=c["placement"], config_epoch=c["epoch"])
            if self.adaptive:
                state["speculative_adaptive"] = True
            state.update(self.state_extra)
            return {**launch, "internal_states": [state], "version": "0.1.0", "engine": "refengine",
                    "startup_time": self.startup_time}
        launch.update({k: 1.0 for k in SGLANG_UPDATABLE[1:]})
        state.update({k: 1.0 for k in SGLANG_UPDATABLE[1:]}, **self.overrides)
        state["speculative_adaptive"] = self.adaptive
        state.update(self.state_extra)
        return {**launch, "internal_states": [state], "version": "0.5.23", "frontend": "python",
                "startup_time": self.startup_time}

    def metrics(self) -> str:
        lab = 'model_name="tiny-llama",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        lines = [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{{{lab}}} 2.0",
            "# TYPE sglang:gen_throughput gauge",
            f"sglang:gen_throughput{{{lab}}} 42.0",
            "# TYPE sglang:spec_accept_length gauge",
            f"sglang:spec_accept_length{{{lab}}} 2.5",
            "# TYPE sglang:spec_num_steps gauge",
            f"sglang:spec_num_steps{{{lab}}} {self.config['steps']}",
            "# TYPE sglang:realtime_tokens counter",
            f'sglang:realtime_tokens_total{{{lab},mode="decode"}} {self.decode_tokens}',
            "# TYPE sglang:forward_execution_seconds counter",
        ]
        lines += [f'sglang:forward_execution_seconds_total{{{lab},category="{c}"}} {v}' for c, v in self.forward_s.items()]
        if self.kind == "refengine" or self.plugin:
            lines += ["# TYPE specdecode:accept_position counter"]
            lines += [f'specdecode:accept_position_total{{k="{k}"}} {v}' for k, v in enumerate(self.accept_tail)]
            lines += ["# TYPE specdecode:rank_info gauge",
                      'specdecode:rank_info{tp_rank="0",pid="11",pci_bus_id="",host="standin"} 1.0',
                      'specdecode:rank_info{tp_rank="1",pid="12",pci_bus_id="",host="standin"} 1.0']
        return "\n".join(lines) + "\n"

    def set_state(self, body: Any) -> tuple[int, Any]:
        self.posts.append(body)
        args = body.get("server_args", {}) if isinstance(body, dict) else {}
        if self.kind == "sglang":
            # All or nothing, as SGLang's set_internal_state: validate every key, then apply.
            ok = set(args) <= {*SGLANG_UPDATABLE, *(PLUGIN_UPDATABLE if self.plugin else ())}
            if ok and "specdecode_num_steps" in args:
                self.config["steps"] = int(args["specdecode_num_steps"])
                self.config["num_draft_tokens"] = self.config["steps"] + 1
            if ok:
                self.overrides.update({k: v for k, v in args.items() if k in SGLANG_UPDATABLE})
            return 200, [bool(ok)]
        if self.refuse_next:
            msg, self.refuse_next = self.refuse_next, None
            return 400, {"error": {"message": msg, "type": "invalid_request_error", "code": 400}}
        names = {"speculative_num_steps": "steps", "speculative_eagle_topk": "topk",
                 "speculative_num_draft_tokens": "num_draft_tokens", "speculative_draft_placement": "placement"}
        for k, v in args.items():
            self.config[names[k]] = v
        if "speculative_num_steps" in args and self.config["topk"] == 1:
            self.config["num_draft_tokens"] = self.config["steps"] + 1
        self.config["epoch"] += 1
        return 200, [True]

    # -- serving ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> "StandIn":
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _broken(self) -> bool:
                if standin.api_key and self.headers.get("Authorization") != f"Bearer {standin.api_key}":
                    self._send(401, {"error": {"message": "Unauthorized"}})
                    return True
                if standin.mode == "html":
                    self._send(200, "<!DOCTYPE html><html><body>Welcome to nginx</body></html>", "text/html")
                elif standin.mode == "500":
                    self._send(500, "Internal Server Error", "text/plain")
                elif standin.mode == "garbage":
                    self._send(200, "\x00\x01 this is {not prometheus or json", "text/plain")
                else:
                    return False
                return True

            def do_GET(self) -> None:
                if self._broken():
                    return
                u = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                if u.path in ("/server_info", "/get_server_info"):
                    self._send(200, standin.server_info())
                elif u.path == "/metrics":
                    self._send(200, standin.metrics(), "text/plain; version=0.0.4")
                elif u.path == "/specdecode/phases" and (standin.kind == "refengine" or standin.plugin):
                    after, limit = int(q.get("after", 0)), int(q.get("limit", 1024))
                    recs = [r for r in standin.records if r["seq"] > after][:limit]
                    nxt = recs[-1]["seq"] if recs else min(after, standin.seq)
                    first = recs[0]["seq"] if recs else nxt + 1
                    self._send(200, {"next": nxt, "dropped": max(0, first - after - 1) if recs else 0,
                                     "records": recs})
                elif u.path == "/specdecode/streams" and standin.plugin:
                    self._send(200, {"plugin": "specdecode", "version": "0.1.0", "streams": []})
                else:
                    self._send(404, {"error": {"message": "Not Found"}})

            def do_POST(self) -> None:
                if self._broken():
                    return
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path == "/set_internal_state":
                    self._send(*standin.set_state(body))
                elif self.path == "/generate":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    ids: list[int] = []
                    try:
                        for i in range(standin.generate_tokens):
                            new = [100 + i, 200 + i] if i % 2 else [100 + i]               # uneven chunks
                            ids = ids + new
                            # SGLang's --incremental-streaming-output sends only the new ids
                            sent = new if standin.incremental else ids
                            chunk = {"text": "x" * len(sent), "output_ids": sent, "meta_info": {"id": "r"}}
                            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.write(b"data: [DONE]\n\n")
                    except (BrokenPipeError, ConnectionResetError):
                        pass          # the client stopped reading (the load driver was stopped)
                else:
                    self._send(404, {"error": {"message": "Not Found"}})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
