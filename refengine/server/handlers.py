"""HTTP routes of the server, shaped as SGLang 0.5.23's, on the standard library's http.server.

Each route is a small function taking (app, request) and returning a Reply, or writing a stream.
Must not hold engine state (that is ServerApp's) and must not let one bad request hurt the server:
every failure becomes a 4xx/5xx reply with a message.

Reply shapes the headless core (tuner/backends) parses:
- /server_info: every launch arg at top level, never changed (`launch_command` with the key
  redacted), plus `status`, `version`, `"engine": "refengine"` (tells it from SGLang) and
  `internal_states`: a list of one dict, the launch args with the *active* knobs, `config_epoch`,
  `world_size`, `last_gen_throughput`, `avg_spec_accept_length`, `emulated_comm`, `simulated_accept` and the
  adaptive schedule in force (`speculative_adaptive`, `speculative_adaptive_config`,
  `specdecode_num_steps`: the pinned tier, -1 when the policy chooses).
- /set_internal_state: 200 `[true]` after every rank applied it (changes are serialised, each gets
  its own epoch, and /server_info shows a config only once every rank runs it); 400
  `{"error": {"message", "type": "BadRequestError", "code": 400}}` with nothing changed otherwise
  (an unknown key: SGLang's `Updating KEY is not supported.`); 503 when the engine is gone.
- /start_profile, /stop_profile: 200 text (stop returns after every rank wrote its file); 400 JSON for
  a second start, a stop with nothing running, or a bad body.
- /flush_cache[?timeout=S]: 200 text when idle (or idle within S seconds), 400 while requests run.
- /generate, /v1/completions: when the engine fails a request, a non-streaming reply is 503
  `{"error": ...}`; a stream sends the final chunk (`finish_reason` `{"type": "abort", "message"}`),
  then `data: {"error": {...}}`, then `data: [DONE]`. A client that leaves mid-stream has its request
  aborted at once; a non-streaming one is gone on a reset or a failed write, not on EOF (a client
  that half-closed after sending gets its reply, after an interim `100 Continue` probe).
- 401 `{"error": "Unauthorized"}` without the key (`/health*` and `/metrics` are open, as in SGLang);
  404/405/413 JSON errors; 503 while starting. A `rid` already in flight: 400 `Duplicate request ID
  detected: {rid}` (SGLang's).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import select
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

from refengine.messages import GenUpdate
from refengine.server import auth, openai_shapes, sse, wire
from refengine.server.chat import parse_chat
from refengine.server.generation import check_fits, reply_dicts, run_all
from refengine.server.inputs import (MAX_BODY_BYTES, SCHEMA_ERROR, BadRequest, GenerateInput, parse_completion,
                                     parse_generate, parse_int_query, parse_internal_state, parse_json)
from refengine.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from refengine.server.outputs import completion_choice, completion_reply
from refengine.server.profiles import ProfileRequestError, parse_profile_request

if TYPE_CHECKING:
    from refengine.server.app import ServerApp

log = logging.getLogger("refengine.server")

MAX_PHASE_RECORDS = 4096
# How often a non-streaming request checks that its client is still connected, and how often at
# most a client that half-closed is probed with an interim reply (Handler._client_gone).
CLIENT_POLL_S = 0.25
PROBE_EVERY_S = 1.0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes
    headers: Any
    client_gone: Callable[[], bool] = lambda: False
    """True once the client closed its connection (checked while a non-streaming reply is made)."""


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(obj).encode())


def text_reply(text: str, status: int = 200) -> Reply:
    return Reply(status, text.encode(), "text/plain; charset=utf-8")


def error_reply(message: str, status: int = 400, err_type: str = "BadRequestError") -> Reply:
    return json_reply({"error": {"message": message, "type": err_type, "code": status}}, status)


def generate_error_reply(message: str, status: int = 400) -> Reply:
    """/generate's error body as SGLang's _create_error_response writes it (http_server.py:2246-2250):
    only the message, nested under "error"."""
    return json_reply({"error": {"message": message}}, status)


def not_found_reply(status: int = 404) -> Reply:
    """Starlette's answer for a path no route has, or a method the route does not take (SGLang
    serves through FastAPI)."""
    return json_reply({"detail": "Not Found" if status == 404 else "Method Not Allowed"}, status)


def openai_error_reply(message: str, status: int = 400, err_type: str = "BadRequestError") -> Reply:
    """SGLang's ErrorResponse for its OpenAI routes: flat, not nested under "error"
    (openai/protocol.py:106-111, serving_base.py:205-221, http_server.py:635-690)."""
    return json_reply({"object": "error", "message": message, "type": err_type, "param": None,
                       "code": status}, status)


# ----- status and information ------------------------------------------------------------------

def health(app: ServerApp, req: Request) -> Reply:
    if not app.ready.is_set():
        return text_reply("starting", 503)
    if app.stopping.is_set() or not app.engine_alive():
        return text_reply("unhealthy", 503)
    stalled = app.engine_stalled()
    if stalled is not None:
        return text_reply(f"unhealthy: {stalled}", 503)
    return Reply(200, b"", "text/plain; charset=utf-8")


def ready(app: ServerApp, req: Request) -> Reply:
    """SGLang's GET /ready (http_server.py:714-718): 200 once the server takes requests, else 503;
    no body either way."""
    serving = app.ready.is_set() and not app.stopping.is_set() and app.engine_alive()
    return Reply(200 if serving else 503, b"", "text/plain; charset=utf-8")


def health_generate(app: ServerApp, req: Request) -> Reply:
    r = health(app, req)
    if r.status != 200:
        return r
    # As SGLang: a server that is busy decoding proves its health without an extra request.
    if app.busy() and time.time() - app.last_iteration_t < 5.0:
        return Reply(200, b"", "text/plain; charset=utf-8")
    gen = app.new_generation(parse_generate({"input_ids": [0], "sampling_params": {
        "max_new_tokens": 1, "temperature": 0}}).items[0], count=False)
    out = run_all([gen], deadline_s=20.0)[0]
    if (out.finish_reason or {}).get("type") == "abort":
        return text_reply("unhealthy", 503)
    return Reply(200, b"", "text/plain; charset=utf-8")


def model_info(app: ServerApp, req: Request) -> Reply:
    return json_reply(app.model_info())


def server_info(app: ServerApp, req: Request) -> Reply:
    return json_reply(app.server_info())


def models(app: ServerApp, req: Request) -> Reply:
    return json_reply(openai_shapes.model_list(app.opts.model_name, int(app.startup_time), app.context_length()))


def model_by_name(app: ServerApp, req: Request) -> Reply:
    """GET /v1/models/{model} (http_server.py:2025-2050): the card, or SGLang's 404 body."""
    name = unquote(req.path[len("/v1/models/"):])
    if name != app.opts.model_name:
        return json_reply({"error": {"message": f"The model '{name}' does not exist",
                                     "type": "invalid_request_error", "param": "model",
                                     "code": "model_not_found"}}, 404)
    return json_reply(openai_shapes.model_card(name, int(app.startup_time), app.context_length()))


def metrics(app: ServerApp, req: Request) -> Reply:
    return Reply(200, app.metrics.render(), METRICS_CONTENT_TYPE)


# ----- generation -------------------------------------------------------------------------------

def generate(app: ServerApp, req: Request, stream: Callable[[], Any]) -> Reply | None:
    batch = parse_generate(parse_json(req.body), app.vocab_size())
    gens = [app.new_generation(item, streaming=batch.stream) for item in batch.items]
    if not batch.stream:
        outs, failure = _run_unstreamed(gens, req.client_gone)
        if failure is not None:
            return failure
        return json_reply(reply_dicts(outs, batch.batch))
    g = gens[0]
    with _sse(g, stream) as w:
        for out in g.updates_until_done():
            _send(w, out.generate_reply(), out.error)
    return None


def openai_body(req: Request) -> Any:
    """The parsed body of an OpenAI route. SGLang's validate_json_request (http_server.py:695-706)
    wants it declared application/json (a missing Content-Type too); that and a body FastAPI cannot
    parse are request-validation errors, whose type is "Bad Request" (:635-690)."""
    media = (req.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        raise BadRequest("Unsupported Media Type: Only 'application/json' is allowed", err_type=SCHEMA_ERROR)
    try:
        return parse_json(req.body)
    except BadRequest as e:
        raise BadRequest(str(e), e.status, SCHEMA_ERROR) from None


def completions(app: ServerApp, req: Request, stream: Callable[[], Any]) -> Reply | None:
    batch = parse_completion(openai_body(req), app.vocab_size())
    model = batch.extras.get("model") or app.opts.model_name
    cid = "cmpl-" + uuid.uuid4().hex
    gens = [app.new_generation(item, streaming=batch.stream) for item in batch.items]
    echo = [i.text if i.text is not None else app.decode(list(i.input_ids or ())) for i in batch.items] \
        if batch.extras.get("echo") else None
    details = bool(batch.extras.get("return_spec_tokens_details"))
    if not batch.stream:
        outs, failure = _run_unstreamed(gens, req.client_gone)
        if failure is not None:
            return failure
        return json_reply(_completion_response(completion_reply(cid, model, outs, echo), outs, details))
    g = gens[0]
    sent = 0
    created = int(time.time())
    with _sse(g, stream) as w:
        if echo:
            w.write(sse.event(_chunk(cid, model, {"index": 0, "text": echo[0], "logprobs": None,
                                                  "finish_reason": None, "matched_stop": None})))
        for out in g.updates_until_done():
            # OpenAI streams deltas, unlike /generate's cumulative chunks.
            choice = completion_choice(out, 0, out.text[sent:])
            sent = len(out.text)
            chunks = [_chunk(cid, model, choice)] if choice["text"] or out.finished else []
            if out.finished and not out.error:
                # serving_completions.py:454-496: sglext and usage come after the last choice,
                # each in a chunk of its own with no choices.
                chunks += openai_shapes.completion_tail_chunks(
                    cid, model, created, out, details, bool(batch.extras.get("include_usage")))
            _send_all(w, chunks, out.error)
    return None


def _completion_response(reply: dict, outs: list, details: bool) -> dict:
    """serving_completions.py:532-647: usage as UsageInfo, the weight-version metadata, and sglext
    with every SpecTokensDetails field (left out when no request has spec statistics)."""
    reply["usage"] = openai_shapes.usage_info(outs)
    reply["metadata"] = {"weight_version": "default"}
    sglext = openai_shapes.completion_sglext(outs, details)
    if sglext is not None:
        reply["sglext"] = sglext
    return reply


def chat_completions(app: ServerApp, req: Request, stream: Callable[[], Any]) -> Reply | None:
    """/v1/chat/completions as serving_chat.py serves it: the model's chat template renders the
    messages (add_generation_prompt), the text is encoded without added special tokens, and the
    reply or stream has SGLang's layout (openai_shapes)."""
    creq = parse_chat(openai_body(req))
    if app.chat_template is None:
        raise BadRequest(f"this model has no usable chat template: {app.chat_template_error}")
    ctx = app.context_length()
    if ctx is not None:
        # Cheap bounds first: the messages' text, then the rendered prompt, each counted without
        # tokenizing (a 10 MB prompt took 12 s of the HTTP process's CPU to tokenize, and stalled
        # /metrics behind it).
        text = "".join(m["content"] for m in creq.messages if isinstance(m.get("content"), str))
        check_fits(app.tokenizer.fewest_tokens(text), creq.max_tokens or 0, ctx, "at least ")
    prompt = app.chat_template.render(creq.messages, add_generation_prompt=True, extra=creq.template_kwargs)
    if ctx is not None:
        check_fits(app.tokenizer.fewest_tokens(prompt), creq.max_tokens or 0, ctx, "at least ")
    ids = app.tokenizer.encode(prompt)
    if not ids:
        raise BadRequest("the rendered chat prompt is empty")
    max_new = creq.max_tokens
    if max_new is None:
        # No max_tokens: SGLang's scheduler lets the reply run to the context length.
        ctx = app.context_length() or (len(ids) + creq.sampling.max_new_tokens)
        if len(ids) >= ctx:
            raise BadRequest(f"the chat prompt ({len(ids)} tokens) does not fit the context length {ctx}")
        max_new = ctx - len(ids)
    rid = "chatcmpl-" + uuid.uuid4().hex  # serving_chat.py:638-639
    item = GenerateInput(text=None, input_ids=tuple(ids), rid=rid,
                         sampling=dataclasses.replace(creq.sampling, max_new_tokens=max_new))
    model = creq.model or app.opts.model_name
    g = app.new_generation(item, streaming=creq.stream)
    if not creq.stream:
        outs, failure = _run_unstreamed([g], req.client_gone)
        if failure is not None:
            return failure
        return json_reply(openai_shapes.chat_reply(rid, model, outs[0], creq.spec_details))
    created = int(time.time())
    sent = 0
    first = True
    with _sse(g, stream) as w:
        for out in g.updates_until_done():
            chunks = []
            if first:
                chunks.append(openai_shapes.chat_role_chunk(rid, model, created))
                first = False
            delta = out.text[sent:]
            sent = len(out.text)
            if delta:
                chunks.append(openai_shapes.chat_content_chunk(rid, model, created, delta))
            if out.finished and not out.error:
                chunks.append(openai_shapes.chat_finish_chunk(rid, model, created, out))
                chunks += openai_shapes.chat_tail_chunks(rid, model, created, out, creq.spec_details,
                                                         creq.include_usage)
            _send_all(w, chunks, out.error)
    return None


def _run_unstreamed(gens: list, client_gone: Callable[[], bool]) -> tuple[list, Reply | None]:
    """Run every generation to its end; the first failure is the whole request's 503 (as SGLang).

    A watcher checks the connection meanwhile: a client that left ends its generations (abort,
    batch slot freed) instead of leaving them to run for nobody."""
    done = threading.Event()
    left = threading.Event()

    def watch() -> None:
        while not done.wait(CLIENT_POLL_S):
            if client_gone():
                left.set()
                # Wake the waiting thread with a final update; it ends the engine requests below.
                for g in gens:
                    g.updates.put(GenUpdate(g.out.rid, [], finished=True, finish_reason="abort",
                                            error="client disconnected"))
                return

    watcher = threading.Thread(target=watch, name="client-watch", daemon=True)
    watcher.start()
    try:
        outs = run_all(gens)
    finally:
        done.set()
        # The watcher may write a probe (Handler._client_gone): it must be done before the reply.
        watcher.join()
    if left.is_set():
        for g in gens:
            g.cancel("client disconnected")
        log.info("client disconnected; aborted %d request(s)", len(gens))
    failed = [o.error for o in outs if o.error]
    if failed:
        return outs, error_reply(f"generation failed: {failed[0]}", 503, "ServiceUnavailable")
    return outs, None


@contextmanager
def _sse(g: Any, stream: Callable[[], Any]) -> Iterator[Any]:
    """Start one streamed generation and yield its event writer; [DONE] closes a stream that ran to
    its end, and a client that went away (OSError on write) cancels the generation instead."""
    g.start()
    w = stream()
    try:
        yield w
        w.write(sse.DONE)
        w.flush()
    except OSError:
        g.cancel("client disconnected")


def _send(w: Any, chunk: dict, error: str | None) -> None:
    _send_all(w, [chunk], error)


def _send_all(w: Any, chunks: list[dict], error: str | None) -> None:
    """The events, then (as SGLang) an error event before [DONE] when the update carries a failure."""
    for chunk in chunks:
        w.write(sse.event(chunk))
    if error:
        w.write(sse.error_event(f"generation failed: {error}", "ServiceUnavailable", 503))
    w.flush()


def _chunk(cid: str, model: str, choice: dict) -> dict:
    # serving_completions.py:387-403: CompletionStreamResponse.model_dump_json() keeps `usage: null`
    # (protocol.py:568-582 drops only a null sglext).
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": None}


# ----- control -----------------------------------------------------------------------------------

def set_internal_state(app: ServerApp, req: Request) -> Reply:
    changes = parse_internal_state(parse_json(req.body))
    app.set_config(changes)  # raises BadRequest on refusal; returns after every rank applied it
    return json_reply([True])


def flush_cache(app: ServerApp, req: Request) -> Reply:
    # The reference engine keeps no prefix cache, so there is nothing to flush; SGLang's
    # refusal while requests run (or its wait of up to ?timeout= seconds) is kept so tools see
    # the same behaviour.
    try:
        timeout = float((req.query.get("timeout") or ["0"])[-1])
    except ValueError:
        raise BadRequest("timeout: expected seconds") from None
    end = time.monotonic() + min(max(timeout, 0.0), 600.0)
    while app.busy() and time.monotonic() < end:
        time.sleep(0.05)
    if app.busy():
        return text_reply("Cache not flushed. Please check backend logs for more details. "
                          "(When there are running or waiting requests, the operation will not be performed.)\n", 400)
    return text_reply("Cache flushed.\nPlease check backend logs for more details. "
                      "(When there are running or waiting requests, the operation will not be performed.)\n")


def start_profile(app: ServerApp, req: Request) -> Reply:
    body = parse_json(req.body)
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    try:
        preq = parse_profile_request(body, app.opts.device)
    except ProfileRequestError as e:
        raise BadRequest(str(e)) from None
    app.start_profile(preq)
    return text_reply("Start profiling.\n")


def stop_profile(app: ServerApp, req: Request) -> Reply:
    app.stop_profile()
    return text_reply("Stop profiling. This will take some time.\n")


# ----- our additions -----------------------------------------------------------------------------

def phases(app: ServerApp, req: Request) -> Reply:
    after = parse_int_query(req.query, "after", 0, -1, 2**62)
    limit = parse_int_query(req.query, "limit", 1024, 1, MAX_PHASE_RECORDS)
    return json_reply(app.phase_page(after, limit))


def slots(app: ServerApp, req: Request) -> Reply:
    return json_reply(app.slots())


def traces(app: ServerApp, req: Request) -> Reply:
    files = [{k: f[k] for k in ("name", "size", "rank", "profile_id")} for f in app.traces.listing()]
    return json_reply({"files": files})


def trace_file(app: ServerApp, req: Request) -> Reply:
    name = unquote(req.path[len("/specdecode/traces/"):])
    path = app.traces.locate(name)
    if path is None:
        return error_reply(f"no trace file named {name!r} (see GET /specdecode/traces)", 404, "NotFoundError")
    return Reply(200, path.read_bytes(), "application/gzip",
                 {"Content-Disposition": f'attachment; filename="{path.name}"'})


GET, POST, PUT = "GET", "POST", "PUT"
ROUTES: dict[str, tuple[tuple[str, ...], Callable[..., Reply | None]]] = {
    "/health": ((GET,), health),
    "/health_generate": ((GET,), health_generate),
    "/ready": ((GET,), ready),
    "/model_info": ((GET,), model_info),
    "/get_model_info": ((GET,), model_info),
    "/server_info": ((GET,), server_info),
    "/get_server_info": ((GET,), server_info),
    "/v1/models": ((GET,), models),
    "/metrics": ((GET,), metrics),
    "/generate": ((POST, PUT), generate),
    "/v1/completions": ((POST,), completions),
    "/v1/chat/completions": ((POST,), chat_completions),
    "/set_internal_state": ((POST, PUT), set_internal_state),
    "/flush_cache": ((GET, POST), flush_cache),
    "/start_profile": ((GET, POST), start_profile),
    "/stop_profile": ((GET, POST), stop_profile),
    "/specdecode/phases": ((GET,), phases),
    "/specdecode/traces": ((GET,), traces),
    "/specdecode/slots": ((GET,), slots),
}
STREAMING = {"/generate", "/v1/completions", "/v1/chat/completions"}
OPENAI_ROUTES = {"/v1/completions", "/v1/chat/completions"}
# Routes that work while the engine is still starting.
EARLY = {"/health", "/health_generate", "/ready", "/metrics"}
# The media type SGLang's OpenAI routes require (http_server.py:695-706, validate_json_request).
JSON_MEDIA_TYPE = "application/json"


def route(path: str) -> tuple[tuple[str, ...], Callable[..., Reply | None]] | None:
    if path in ROUTES:
        return ROUTES[path]
    if path.startswith("/specdecode/traces/"):
        return (GET,), trace_file
    if path.startswith("/v1/models/"):
        return (GET,), model_by_name
    return None


class Handler(BaseHTTPRequestHandler):
    """Binds one connection to the app; `app` is set on a subclass made by ServerApp."""

    app: ServerApp
    protocol_version = "HTTP/1.1"
    server_version = "refengine"
    # Headers and body leave in two writes; with Nagle on, a keep-alive client's delayed ACK
    # adds ~40 ms to every small reply (measured: /server_info 45 ms -> see benchmarks/serve_overhead.py).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        # The key is checked before the body is read: an unauthorized client must not make the
        # server buffer up to MAX_BODY_BYTES. The unread body makes the connection unusable.
        if not auth.authorized(self.app.opts.api_key, path, self.headers.get("Authorization")):
            self.close_connection = True
            self._send(json_reply({"error": "Unauthorized"}, 401))
            return
        try:
            body = self._read_body()
        except BadRequest as e:
            self.close_connection = True  # the rest of the body may still be on the wire
            self._send(error_reply(str(e), e.status))
            return
        found = route(path)
        if found is None:
            self._send(not_found_reply(404))
            return
        methods, fn = found
        if method not in methods:
            self._send(not_found_reply(405))
            return
        if not self.app.ready.is_set() and path not in EARLY:
            self._send(error_reply("the server is starting", 503, "ServiceUnavailable"))
            return
        req = Request(method, path, parse_qs(url.query), body, self.headers, self._client_gone)
        with self.app.requests_in_flight:
            self._dispatch(fn, req, method, path)

    def _dispatch(self, fn: Callable[..., Reply | None], req: Request, method: str, path: str) -> None:
        try:
            if path in STREAMING:
                reply = fn(self.app, req, self._start_stream)
            else:
                reply = fn(self.app, req)
        except BadRequest as e:
            if path in OPENAI_ROUTES:
                reply = openai_error_reply(str(e), e.status, e.err_type)
            elif path == "/generate":
                reply = generate_error_reply(str(e), e.status)
            else:
                reply = error_reply(str(e), e.status, e.err_type)
        except Exception as e:  # noqa: BLE001 - one broken request must not take the server down
            log.exception("error serving %s %s", method, path)
            reply = error_reply(f"internal error: {type(e).__name__}: {e}", 500, "InternalServerError")
            if self._streaming:
                self._write_stream_error(str(e))
                return
        if reply is not None:
            self._send(reply)

    _streaming = False
    # Idle keep-alive connections and clients that stop reading a stream are dropped after this.
    timeout = 120

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return wire.read_chunked(self.rfile, MAX_BODY_BYTES)
        return wire.read_length(self.rfile, self.headers.get("Content-Length"), MAX_BODY_BYTES)

    _probed_at = float("-inf")

    def _client_gone(self) -> bool:
        """The client is gone: its connection was reset, or a write to it failed.

        EOF on the read side is not enough: a client may half-close after sending its request
        (shutdown(SHUT_WR), `nc -N`) and still read the reply. On EOF an HTTP/1.1 client gets an
        interim `100 Continue` (every HTTP/1.1 client must skip 1xx replies), at most once a
        PROBE_EVERY_S: a closed socket answers it with a reset, seen by the next check; a
        half-closed one takes it. A pipelined next request is readable too but has bytes, so it
        does not count."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable or self.connection.recv(1, socket.MSG_PEEK) != b"":
                return False
        except (OSError, ValueError):
            return True                      # reset, or the socket is closed
        if self.request_version != "HTTP/1.1":
            return True                      # no 1xx for HTTP/1.0 (RFC 9110 §15.2)
        now = time.monotonic()
        if now - self._probed_at < PROBE_EVERY_S:
            return False
        self._probed_at = now
        try:
            self.connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        except OSError:
            return True
        return False

    def _start_stream(self) -> Any:
        self._streaming = True
        self.close_connection = True  # an SSE body ends when the connection closes
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        return self.wfile

    def _write_stream_error(self, message: str) -> None:
        try:
            self.wfile.write(sse.error_event(message, "InternalServerError", 500))
            self.wfile.write(sse.DONE)
        except OSError:
            pass

    def _send(self, reply: Reply) -> None:
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            if self.close_connection:
                # Say so: a keep-alive client would otherwise send its next request on a
                # connection the server is closing (e.g. after a 401 whose body was never read).
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)
        except OSError:
            self.close_connection = True
