"""STAND-IN for an SGLang 0.5.23 server process, for testing `specdecode-tune launch` only.

SGLang cannot run here (no GPU, kernel wheels), so `launch`'s process management is tested
against this small real HTTP program that behaves like SGLang where `launch` looks: it takes
SGLang's flags (unknown ones are accepted, as SGLang would have its own), answers /health with
503 while "starting" and 200 after (each answer logged), serves /model_info and /server_info (with `launch_command`
and the resolved speculative args), logs SGLang-like lines, and spawns a child process the way
SGLang spawns its schedulers. Test-only knobs (never SGLang's): env STANDIN_STARTUP_S (seconds
of "starting"), STANDIN_REFUSE ("key=value": exit 1 at startup when launched with it, as SGLang
exits on an invalid config), --standin-child-pidfile PATH (write the spawned child's pid there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model-path", default="stand-in/model")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--speculative-adaptive-config")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--api-key")
    p.add_argument("--standin-child-pidfile")
    args, _unknown = p.parse_known_args()
    resolved = {k: v for k, v in vars(args).items() if not k.startswith("standin")}
    refuse = os.environ.get("STANDIN_REFUSE")
    if refuse:
        key, _, value = refuse.partition("=")
        if str(resolved.get(key)) == value:
            print(f"ValueError: stand-in refuses {key}={value}", flush=True)
            return 1
    for k in ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",):
        resolved[f"env:{k}"] = os.environ.get(k)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if args.standin_child_pidfile:
        with open(args.standin_child_pidfile, "w") as f:
            f.write(str(child.pid))
    ready_at = time.monotonic() + float(os.environ.get("STANDIN_STARTUP_S", "0.3"))
    print(f"[stand-in] Load weight begin. {json.dumps(resolved, sort_keys=True)}", flush=True)
    print("[stand-in] Capture cuda graph begin. This can take up to several minutes.", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            pass

        def _json(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                return self._json(401, {"error": "Unauthorized"})
            if time.monotonic() < ready_at:
                if self.path == "/health":   # in the log, so a test can see what the launcher was told
                    print("[stand-in] /health 503 starting", flush=True)
                return self._json(503, {"error": "starting"})
            if self.path == "/health":
                print("[stand-in] /health 200", flush=True)
                return self._json(200, {})
            if self.path == "/model_info":
                return self._json(200, {"model_path": args.model_path, "is_generation": True})
            if self.path == "/server_info":
                return self._json(200, {**resolved, "launch_command": " ".join(sys.argv[1:]),
                                        "internal_states": [dict(resolved)], "version": "stand-in"})
            return self._json(404, {"error": "not found"})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print("[stand-in] The server is fired up and ready to roll!", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        child.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
