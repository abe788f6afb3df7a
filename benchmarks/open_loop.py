"""An open-loop load for benchmarks: requests sent at fixed moments (a Poisson script), whatever the
server's speed, each streamed to its end, with the client's times per request.

Open loop is how a public server is loaded: arrivals do not wait for answers, so a slow setting
queues requests and shows in latency (TPOT, end-to-end) rather than in a lower arrival rate. The
closed-loop load (a fixed number in flight) is tuner.backends.load.LoadDriver; this module reuses
its bounded SSE reader. It must not decide anything: it records times and token counts.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from tuner.backends.load import StreamTooLong, sse_lines


class OpenLoop:
    """Sends `/generate` streams at the offsets of a script; `run` returns one dict per request:
    sent, first (first token), done (last chunk), tokens, error (None when it reached [DONE])."""

    def __init__(self, url: str, prompts: list[dict[str, Any]], max_new_tokens: int,
                 timeout_s: float = 600.0, max_connections: int = 512) -> None:
        self.prompts, self.max_new_tokens = prompts, max_new_tokens
        self._client = httpx.Client(base_url=url.rstrip("/"), trust_env=False,
                                    headers={"Accept-Encoding": "identity"},
                                    timeout=httpx.Timeout(timeout_s, connect=5.0),
                                    limits=httpx.Limits(max_connections=max_connections))

    def close(self) -> None:
        self._client.close()

    def run(self, offsets: list[float], t_start: float | None = None) -> list[dict[str, Any]]:
        """Send request i at t_start + offsets[i] (wall clock), wait until every one ended."""
        t_start = time.time() if t_start is None else t_start
        results: list[dict[str, Any]] = [{} for _ in offsets]
        threads = []
        pace = threading.Event()       # never set: its wait is the pacing between arrivals
        for i, off in enumerate(offsets):
            delay = t_start + off - time.time()
            if delay > 0:
                pace.wait(delay)
            th = threading.Thread(target=self._one, args=(i, results[i]), daemon=True, name=f"open-{i}")
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        return results

    def _one(self, i: int, out: dict[str, Any]) -> None:
        p = self.prompts[i % len(self.prompts)]
        body = {"input_ids": p["input_ids"], "stream": True,
                "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0.0, "ignore_eos": True,
                                    **(p.get("sampling_params") or {})}}
        out.update(sent=time.time(), first=None, done=None, tokens=0, error=None)
        try:
            with self._client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    out["error"] = f"HTTP {resp.status_code}"
                    return
                for line in sse_lines(resp.iter_raw()):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        out["done"] = out["done"] or time.time()
                        return
                    obj = json.loads(data)
                    if isinstance(obj, dict) and "error" in obj:
                        out["error"] = str(obj["error"])[:200]
                        return
                    ids = obj.get("output_ids") if isinstance(obj, dict) else None
                    if isinstance(ids, list) and len(ids) > out["tokens"]:
                        now = time.time()
                        if out["first"] is None:
                            out["first"] = now
                        out["tokens"], out["done"] = len(ids), now
            out["error"] = "the stream ended without [DONE]"
        except (httpx.HTTPError, StreamTooLong, json.JSONDecodeError) as e:
            out["error"] = f"{type(e).__name__}: {str(e)[:160]}"
