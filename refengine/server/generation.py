"""Running generation requests through the engine client: tokenize, submit, collect updates.

Used by the /generate and /v1/completions handlers, streaming or not. Must not format HTTP replies
(that is the handlers' job) and must never leave an engine request running after its client left.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, Iterator, Protocol

from refengine.messages import GenRequest, GenUpdate
from refengine.server.inputs import BadRequest, GenerateInput
from refengine.server.outputs import RequestOutput, new_rid

# A request whose engine goes silent this long is failed rather than left hanging forever.
UPDATE_TIMEOUT_S = 600.0


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class Engine(Protocol):
    def submit(self, req: GenRequest, on_update: Callable[[GenUpdate], None]) -> None: ...
    def abort(self, rid: str) -> None: ...


class Admission:
    """SGLang's waiting queue: at most `cap` requests in the engine, the rest wait here in order.

    Requests join the engine's batch as soon as one leaves (the engine batches continuously
    between iterations), so the queue only holds what exceeds --max-running-requests.
    """

    def __init__(self, engine: Engine, cap: int) -> None:
        self.engine = engine
        self.cap = cap
        self._lock = threading.Lock()
        self._running: list[Generation] = []
        self._waiting: collections.deque[Generation] = collections.deque()

    def enter(self, gen: Generation) -> None:
        with self._lock:
            now = len(self._running) < self.cap
            (self._running if now else self._waiting).append(gen)
        if now:
            gen.submit_now()

    def leave(self, gen: Generation) -> None:
        """`gen` finished in the engine or gave up waiting; admit the next waiting request."""
        with self._lock:
            if gen in self._waiting:
                self._waiting.remove(gen)
            if gen in self._running:
                self._running.remove(gen)
            admitted = []
            while self._waiting and len(self._running) < self.cap:
                nxt = self._waiting.popleft()
                self._running.append(nxt)
                admitted.append(nxt)
        for g in admitted:
            g.submit_now()

    def snapshot(self) -> tuple[list[Generation], list[Generation]]:
        with self._lock:
            return list(self._running), list(self._waiting)


class Generation:
    """One prompt in flight: its engine request and its SGLang-shaped output so far."""

    def __init__(self, admission: Admission, tokenizer: Tokenizer, item: GenerateInput, *,
                 speculative: bool, context_length: int | None, on_finish: Callable[[RequestOutput], None]):
        self.admission = admission
        self.updates: queue.Queue[GenUpdate] = queue.Queue()
        ids = list(item.input_ids) if item.input_ids is not None else tokenizer.encode(item.text or "")
        if not ids:
            raise BadRequest("the prompt is empty after tokenization")
        sp = item.sampling
        if context_length is not None and len(ids) + sp.max_new_tokens > context_length:
            raise BadRequest(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the "
                f"context length {context_length}")
        self.out = RequestOutput(rid=item.rid or new_rid(), prompt_tokens=len(ids), sampling=sp,
                                 decode=tokenizer.decode, speculative=speculative)
        self.on_finish = on_finish
        self.req = GenRequest(rid=self.out.rid, input_ids=ids, max_new_tokens=sp.max_new_tokens,
                              temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                              stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos,
                              seed=sp.sampling_seed)
        self.submitted = False
        self.engine_done = False
        self.started = False
        self._reported = False
        self._lock = threading.Lock()

    def start(self) -> None:
        self.started = True
        if self.req.max_new_tokens == 0:
            # Nothing to generate: answer at once, as SGLang does for max_new_tokens 0.
            self.out.add([], finished=True, reason="length")
            self.engine_done = True
            self._report()
            return
        self.admission.enter(self)

    def submit_now(self) -> None:
        with self._lock:
            if self.engine_done:  # cancelled while it waited
                return
            self.submitted = True
        self.admission.engine.submit(self.req, self._on_update)

    def _on_update(self, u: GenUpdate) -> None:
        # Called on the engine client's reader thread: free the batch slot at once, even if
        # the HTTP thread is still busy writing to a slow client.
        if u.finished:
            with self._lock:
                self.engine_done = True
            self.admission.leave(self)
        self.updates.put(u)

    def step(self, timeout: float = UPDATE_TIMEOUT_S) -> bool:
        """Wait for one engine update and apply it; True when something changed."""
        if self.out.finished:
            return False
        try:
            u = self.updates.get(timeout=timeout)
        except queue.Empty:
            self.cancel("the engine sent nothing for too long")
            return True
        stopped = self.out.add(list(u.token_ids), finished=u.finished, reason=u.finish_reason,
                               matched=u.matched, spec=u.spec, message=u.error)
        if stopped and not u.finished:
            self._abort_in_engine()  # a stop string ended it: free the batch slot now
        if self.out.finished:
            self._report()
        return True

    def updates_until_done(self) -> Iterator[RequestOutput]:
        while not self.out.finished:
            if self.step():
                yield self.out

    def _abort_in_engine(self) -> None:
        with self._lock:
            waiting = not self.submitted and not self.engine_done
            self.engine_done = self.engine_done or waiting
        if waiting:
            self.admission.leave(self)
        elif not self.engine_done:
            try:
                self.admission.engine.abort(self.out.rid)
            except Exception:  # noqa: BLE001 - the engine may already be gone; nothing else to free
                pass

    def cancel(self, message: str) -> None:
        """The client went away or the server is stopping: abort the engine request."""
        self._abort_in_engine()
        if not self.out.finished:
            self.out.add([], finished=True, reason="abort", message=message)
        self._report()

    def _report(self) -> None:
        if not self._reported:
            self._reported = True
            self.on_finish(self.out)


def run_all(gens: list[Generation], deadline_s: float = UPDATE_TIMEOUT_S) -> list[RequestOutput]:
    """Start every prompt of a batch and wait for all of them (non-streaming replies)."""
    started: list[Generation] = []
    try:
        for g in gens:
            g.start()
            started.append(g)
        end = time.monotonic() + deadline_s
        for g in gens:
            while not g.out.finished:
                g.step(timeout=max(0.0, end - time.monotonic()))
    except BaseException:
        for g in started:
            g.cancel("request failed")
        raise
    return [g.out for g in gens]


def reply_dicts(outs: list[RequestOutput], batch: bool) -> Any:
    replies = [o.generate_reply() for o in outs]
    return replies if batch else replies[0]
