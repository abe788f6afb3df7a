"""The load driver: streaming /generate requests, closed loop (N in flight) or open loop (Poisson).

Closed loop (the default): each of N worker threads keeps one request in flight (a new one starts as
soon as one ends), so concurrency stays constant across a configuration change. Open loop (`rate`):
arrivals come as a Poisson process of `rate` requests/s, as SGLang's `bench_serving
--request-rate`, and N is the cap on requests in flight (bench_serving's --max-concurrency); an
arrival that finds every slot taken waits (its wait is recorded) and arrivals past a backlog of
MAX_BACKLOG are dropped and counted, so a server slower than the rate shows as such.

Every request that reaches [DONE] is one `load_request` event with its exact timings
(tuner.core.latency.RequestTiming: TTFT from the send, each later output's gap with its new tokens,
e2e, the server's queue time when meta_info carries it). Tokens are counted by `output_ids` of the
cumulative SSE chunks, never by chunks. A reporter emits load/* series at ~4 Hz beside the server's
own figures. Must not touch the store; errors become folded LOAD_ERROR events, never exceptions.

Acceptance by context length without a phase stream (`context_buckets`): SGLang's final chunk
carries each request's `spec_correct_drafts_histogram` with `prompt_tokens` and
`completion_tokens` (native /generate; the OpenAI routes need `return_spec_tokens_details`). The
driver files each finished request's histogram under the context bucket of its middle verify round
(prompt + completion / 2; a request's rounds span prompt .. prompt + completion) and emits the same
`spec/<bucket>/...` series the phase records give. Coarser than the records' per-round `ctx`, so
a session with a phase stream leaves it off (the two would count the same rounds twice).
"""

from __future__ import annotations

import itertools
import json
import queue
import random
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import httpx

from probes import accept_buckets as AB
from tuner.core import series as S
from tuner.core.acceptance import add_histograms
from tuner.core.bus import Bus
from tuner.core.clock import Clock
from tuner.core.events import EventKind
from tuner.core.latency import RequestTiming
from tuner.core.records import Event, Sample

REPORT_EVERY_S = 0.25
REQUEST_TIMEOUT_S = 600.0
# One SSE line holds the cumulative output of one request (a few KB); a server that never ends a
# line must not grow it without bound. Error bodies are read only this far.
MAX_SSE_LINE = 4 * 1024 * 1024
MAX_ERROR_BODY = 64 * 1024
MAX_BACKLOG = 10_000          # open loop: arrivals waiting for a slot past this are dropped (counted)


class StreamTooLong(Exception):
    """An SSE line past MAX_SSE_LINE."""


def sse_lines(chunks: Iterable[bytes], limit: int = MAX_SSE_LINE) -> Iterator[str]:
    """Lines of an SSE stream from raw chunks, each at most `limit` bytes (StreamTooLong otherwise)."""
    buf = bytearray()
    for chunk in chunks:
        buf.extend(chunk)
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(buf[:nl]).rstrip(b"\r")
            del buf[: nl + 1]
            yield line.decode("utf-8", errors="replace")
        if len(buf) > limit:
            raise StreamTooLong(f"an SSE line longer than {limit // 2**20} MB")
    if buf:
        yield bytes(buf).decode("utf-8", errors="replace")


def _capped_text(resp: httpx.Response, cap: int = MAX_ERROR_BODY) -> str:
    """The first `cap` bytes of a body, never more (an error page can be endless too)."""
    got = bytearray()
    for chunk in resp.iter_raw():
        got.extend(chunk)
        if len(got) >= cap:
            break
    return bytes(got[:cap]).decode("utf-8", errors="replace")


class PromptFileError(ValueError):
    """A prompt file that cannot be used (one line, with the line number)."""


def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL prompt file: each line {"text": ...} or {"input_ids": [...]} (plus optional
    "sampling_params"), or a bare JSON string. Blank lines and lines starting with # are skipped."""
    prompts: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PromptFileError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PromptFileError(f"{path} is not UTF-8 text (expected JSON lines)") from None
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{n}: not JSON ({e.msg})") from None
        if isinstance(obj, str):
            obj = {"text": obj}
        if not isinstance(obj, dict) or not (isinstance(obj.get("text"), str) or isinstance(obj.get("input_ids"), list)):
            raise PromptFileError(f'{path}:{n}: each line needs "text" (a string) or "input_ids" (a list)')
        prompts.append(obj)
    if not prompts:
        raise PromptFileError(f"{path}: no prompts")
    return prompts


class LoadDriver:
    """Keeps `concurrency` streaming requests in flight against `url` until stopped.

    Args:
        url: the server's base URL.
        bus, clock: where load/* samples and load events go, and their time.
        prompts: from load_prompts(); used round-robin.
        concurrency: requests in flight at all times.
        max_new_tokens: per request (ignore_eos so lengths stay equal across settings).
        api_key: sent as Authorization: Bearer.
        sampling_params: extra sampling params (default greedy: temperature 0).
        context_buckets: emit acceptance by context bucket from finished requests' statistics
            (see the module docstring); for servers without a phase stream.
        rate: open loop, Poisson arrivals of this many requests/s (concurrency caps those in
            flight); None: closed loop.
        seed: the arrival process's seed (the same arrivals for the same seed).
    """

    def __init__(self, url: str, bus: Bus, clock: Clock, prompts: list[dict[str, Any]], concurrency: int,
                 max_new_tokens: int = 128, api_key: str | None = None,
                 sampling_params: dict[str, Any] | None = None, context_buckets: bool = False,
                 incremental: bool = False, rate: float | None = None, seed: int = 0) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if rate is not None and not (rate > 0 and rate < float("inf")):
            raise ValueError(f"the request rate must be a positive number of requests/s, got {rate}")
        if not prompts:
            raise ValueError("no prompts")
        self.url = url.rstrip("/")
        self.bus, self.clock = bus, clock
        self.prompts = prompts
        self.concurrency = concurrency
        self.max_new_tokens = max_new_tokens
        self.sampling_params = {"temperature": 0.0, "ignore_eos": True, **(sampling_params or {})}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        headers["Accept-Encoding"] = "identity"       # the stream is read raw, line by bounded line
        self._client = httpx.Client(base_url=self.url, headers=headers, trust_env=False,
                                    timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=3.0),
                                    limits=httpx.Limits(max_connections=concurrency + 2))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next = itertools.count()
        self.tokens = 0            # generated tokens counted so far (output_ids)
        self.requests = 0          # requests that ran to [DONE]
        self.done_tokens = 0       # tokens of those requests
        self.errors = 0
        self.inflight = 0
        self._last_error = ""
        self._live: dict[int, int] = {}    # worker -> tokens of its current request so far
        self.context_buckets = context_buckets
        # SGLang launched --incremental-streaming-output sends each chunk's new ids only
        # (arg_groups/fields/serving.py:274-277): then the chunks are summed, not the longest taken.
        self.incremental = incremental
        self._buckets: dict[str, list[float]] = {}   # context bucket -> histogram not yet reported
        self.rate = rate
        self._rng = random.Random(seed)
        self._arrivals: queue.Queue[float] = queue.Queue()
        self.dropped = 0           # open loop: arrivals dropped past MAX_BACKLOG

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        data: dict[str, Any] = {"concurrency": self.concurrency, "prompts": len(self.prompts),
                                "max_new_tokens": self.max_new_tokens}
        if self.rate is not None:
            data["rate"] = self.rate
        self.bus.put(Event(self.clock.now(), EventKind.LOAD_STARTED, data))
        work = self._worker if self.rate is None else self._open_worker
        for i in range(self.concurrency):
            th = threading.Thread(target=work, args=(i,), name=f"load-{i}", daemon=True)
            self._threads.append(th)
            th.start()
        if self.rate is not None:
            arr = threading.Thread(target=self._arrive, name="load-arrivals", daemon=True)
            self._threads.append(arr)
            arr.start()
        rep = threading.Thread(target=self._reporter, name="load-report", daemon=True)
        self._threads.append(rep)
        rep.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._client.close()        # ends streams in flight so workers return promptly
        for th in self._threads:
            th.join(timeout=5)
        self.bus.put_many(self._bucket_samples(self.clock.now()))   # requests filed since the last report
        data = {"requests": self.requests, "tokens": self.tokens, "errors": self.errors}
        if self.rate is not None:
            data["dropped"] = self.dropped
        self.bus.put(Event(self.clock.now(), EventKind.LOAD_STOPPED, data))

    @property
    def running(self) -> bool:
        return bool(self._threads) and not self._stop.is_set()

    # -- work -------------------------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        p = self.prompts[next(self._next) % len(self.prompts)]
        params = {**self.sampling_params, "max_new_tokens": self.max_new_tokens, **(p.get("sampling_params") or {})}
        body: dict[str, Any] = {"sampling_params": params, "stream": True}
        if "input_ids" in p:
            body["input_ids"] = p["input_ids"]
        else:
            body["text"] = p["text"]
        return body

    def _worker(self, i: int) -> None:
        """Closed loop: one request after another."""
        while not self._stop.is_set():
            self._request(i)

    def _arrive(self) -> None:
        """Open loop: Poisson arrivals (exponential gaps drawn from the seeded generator), on the
        monotonic clock so a wall-clock step cannot bunch or stall them."""
        assert self.rate is not None
        due = time.monotonic()
        while not self._stop.is_set():
            due += self._rng.expovariate(self.rate)
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            if self._arrivals.qsize() >= MAX_BACKLOG:
                with self._lock:
                    self.dropped += 1
                continue
            self._arrivals.put(due)

    def _open_worker(self, i: int) -> None:
        """Open loop: one slot of the cap; takes the next arrival when free."""
        while not self._stop.is_set():
            try:
                arrived = self._arrivals.get(timeout=0.2)
            except queue.Empty:
                continue
            self._request(i, wait=max(0.0, time.monotonic() - arrived))

    def _request(self, i: int, wait: float = 0.0) -> None:
        err: str | None = None
        done = False
        timing = _Timing(time.monotonic(), self.clock.now())
        with self._lock:
            self.inflight += 1
            self._live[i] = 0
        try:
            with self._client.stream("POST", "/generate", json=self._body()) as resp:
                if resp.status_code != 200:
                    err = f"/generate: HTTP {resp.status_code}: {_capped_text(resp)[:120]}"
                elif resp.headers.get("content-encoding", "identity").lower() != "identity":
                    err = "/generate: a compressed event stream is not read"
                else:
                    err, done = self._consume(i, sse_lines(resp.iter_raw()), timing)
        except StreamTooLong as e:
            err = f"/generate: {e}"
        except (httpx.HTTPError, RuntimeError) as e:
            err = None if self._stop.is_set() else f"/generate: {type(e).__name__}: {str(e)[:120]}"
        with self._lock:
            self.inflight -= 1
            n = self._live.pop(i, 0)
            self.tokens += n          # tokens generated count even when stop cut the stream
            if err:
                self.errors += 1
            elif done:
                self.requests += 1
                self.done_tokens += n
        if done and not err:
            rt = timing.result(n, wait)
            if rt is not None:
                self.bus.put(Event(self.clock.now(), EventKind.LOAD_REQUEST, rt.to_data()))
        if err:
            self._error(err)
            self._stop.wait(0.5)     # a dead or refusing server is not hammered

    def _consume(self, i: int, lines: Any, timing: "_Timing | None" = None) -> tuple[str | None, bool]:
        """Read one SSE stream: (error or None, whether it reached [DONE]); `timing` notes when each
        output's new tokens arrived."""
        for line in lines:
            if self._stop.is_set():
                return None, False
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if timing is not None:
                    timing.end = time.monotonic()
                return None, True
            try:
                obj = json.loads(data)
            except json.JSONDecodeError:
                return f"/generate: bad SSE chunk {data[:60]!r}", False
            if isinstance(obj, dict) and "error" in obj:
                e = obj["error"]
                return "/generate: " + str(e.get("message", e) if isinstance(e, dict) else e), False
            # Chunks are cumulative by default: output_ids is the whole list so far, so take its
            # length; with incremental streaming each chunk holds only its new ids.
            ids = obj.get("output_ids") if isinstance(obj, dict) else None
            if isinstance(ids, list):
                with self._lock:
                    before = self._live.get(i, 0)
                    self._live[i] = after = before + len(ids) if self.incremental else max(before, len(ids))
                if timing is not None and after > before:
                    timing.tokens(after - before)
            if timing is not None and isinstance(obj, dict):
                timing.meta(obj.get("meta_info"))
            if self.context_buckets and isinstance(obj, dict):
                self._file_request(obj.get("meta_info"))
        return ("/generate: the stream ended without [DONE]" if not self._stop.is_set() else None), False

    def _file_request(self, meta: Any) -> None:
        """A final chunk's statistics into its context bucket; other chunks (and servers that send
        no histogram) are skipped, malformed values too."""
        if not isinstance(meta, dict):
            return
        h, prompt, done = (meta.get(k) for k in ("spec_correct_drafts_histogram", "prompt_tokens",
                                                  "completion_tokens"))
        counts = [c for c in h if isinstance(c, int) and not isinstance(c, bool) and c >= 0] \
            if isinstance(h, list) else []
        if not counts or len(counts) != len(h) or len(h) < 2 or not sum(counts):
            return
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (prompt, done)):
            return
        name = AB.bucket(AB.CTX, prompt + done // 2)
        with self._lock:
            self._buckets[name] = add_histograms(self._buckets.get(name, []), counts)

    def _bucket_samples(self, t: float) -> list[Sample]:
        with self._lock:
            pending, self._buckets = self._buckets, {}
        out: list[Sample] = []
        for name, h in sorted(pending.items()):
            acc = AB.position_acceptance(h, len(h) - 1)
            out.append(Sample(t, S.bucket_verifies(name), float(acc.verifies)))
            out += [Sample(t, S.bucket_accept_pos(name, k), p) for k, p in enumerate(acc.p, 1)]
        return out

    def _error(self, err: str) -> None:
        with self._lock:
            if err == self._last_error:
                return                   # one event per distinct error, not one per retry
            self._last_error = err
        self.bus.put(Event(self.clock.now(), EventKind.LOAD_ERROR, {"error": err}))

    def counted(self) -> int:
        """Tokens so far, including those of requests still streaming."""
        with self._lock:
            return self.tokens + sum(self._live.values())

    def _reporter(self) -> None:
        last_t, last_n = self.clock.now(), self.counted()
        while not self._stop.wait(REPORT_EVERY_S):
            t, n = self.clock.now(), self.counted()
            if t > last_t:
                with self._lock:
                    inflight, requests, errors = self.inflight, self.requests, self.errors
                self.bus.put_many([Sample(t, S.LOAD_TOK_PER_S, (n - last_n) / (t - last_t)),
                                   Sample(t, S.LOAD_INFLIGHT, float(inflight)),
                                   Sample(t, S.LOAD_REQUESTS, float(requests)),
                                   Sample(t, S.LOAD_ERRORS, float(errors)),
                                   *([Sample(t, S.LOAD_BACKLOG, float(self._arrivals.qsize()))]
                                     if self.rate is not None else []),
                                   *self._bucket_samples(t)])
            last_t, last_n = t, n


class _Timing:
    """One request's clock readings while it streams (monotonic seconds, one thread)."""

    def __init__(self, start: float, sent: float) -> None:
        self.start, self.sent = start, sent
        self.first = self.last = self.end = None   # type: float | None
        self.gaps: list[tuple[float, int]] = []
        self.queue = float("nan")

    def tokens(self, new: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        else:
            assert self.last is not None
            self.gaps.append((now - self.last, new))
        self.last = now

    def meta(self, meta: Any) -> None:
        # SGLang launched --enable-metrics puts req_time_stats' queue_time in meta_info.
        q = meta.get("queue_time") if isinstance(meta, dict) else None
        if isinstance(q, (int, float)) and not isinstance(q, bool) and 0 <= q < 1e6:
            self.queue = float(q)

    def result(self, tokens: int, wait: float) -> RequestTiming | None:
        if self.first is None or self.end is None:
            return None          # no token came: nothing to time
        return RequestTiming(self.sent, self.first - self.start, self.end - self.start, tokens,
                             tuple(self.gaps), self.queue, wait)


# Code-shaped prompts: the shipped tiny model learned from Python sources, and real servers
# speculate well on code too, so the load is typical of where EAGLE-3 is used.
BUILTIN_PROMPTS = (
    "def read_config(path):\n    \"\"\"Read a JSON config file and return it as a dict.\"\"\"\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n",
    "    for i, line in enumerate(lines):\n        if not line.strip():\n",
    "def merge_sorted(a, b):\n    out = []\n    i = j = 0\n",
    "    def __repr__(self):\n        return ",
    "try:\n    import json\nexcept ImportError:\n",
    "def parse_args():\n    parser = argparse.ArgumentParser(",
)


def builtin_prompts() -> list[dict]:
    return [{"text": t} for t in BUILTIN_PROMPTS]
