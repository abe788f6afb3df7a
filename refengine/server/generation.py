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
    def fewest_tokens(self, text: str) -> int: ...


class Engine(Protocol):
    def submit(self, req: GenRequest, on_update: Callable[[GenUpdate], None]) -> None: ...
    def abort(self, rid: str) -> None: ...


def duplicate_rid(rid: str) -> BadRequest:
    """SGLang 0.5.23's refusal of a request id already in flight or repeated in one batch
    (tokenizer_manager.py 3833-3836: a ValueError, which its HTTP layer answers with 400)."""
    return BadRequest(f"Duplicate request ID detected: {rid}")


class Admission:
    """SGLang's waiting queue: at most `cap` requests in the engine, the rest wait here in order.

    Requests join the engine's batch as soon as one leaves (the engine batches continuously
    between iterations), so the queue only holds what exceeds --max-running-requests.
    It also owns the request ids in flight: an id is reserved (`admit`) before anything runs and
    released with the slot (`leave`), when the engine has finished with it or it never reached
    the engine, so the engine never sees two live requests under one id.
    """

    def __init__(self, engine: Engine, cap: int) -> None:
        self.engine = engine
        self.cap = cap
        self._lock = threading.Lock()
        self._running: list[Generation] = []
        self._waiting: collections.deque[Generation] = collections.deque()
        self._rids: dict[str, Generation] = {}

    def admit(self, gens: list[Generation]) -> None:
        """Reserve the ids of one HTTP request's prompts, all or none.

        Raises:
            BadRequest: an id is already in flight or repeated among `gens` (nothing reserved).
        """
        with self._lock:
            seen: set[str] = set()
            for g in gens:
                if g.rid in self._rids or g.rid in seen:
                    raise duplicate_rid(g.rid)
                seen.add(g.rid)
            for g in gens:
                self._rids[g.rid] = g
                g.admitted = True

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
            if self._rids.get(gen.rid) is gen:
                del self._rids[gen.rid]
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

    def held(self) -> dict[str, Any]:
        """What is held now: slots (running), queue places (waiting), reserved ids, and the
        requests still in flight (their reply not complete)."""
        with self._lock:
            return {"running": [g.rid for g in self._running], "waiting": [g.rid for g in self._waiting],
                    "reserved_rids": sorted(self._rids),
                    "in_flight": sorted(r for r, g in self._rids.items() if not g.out.finished)}


def slot_problems(held: dict[str, Any], engine_requests: int) -> list[str]:
    """The invariant "when nothing is in flight, no slot is held": the ways `held` (from
    Admission.held) and the engine client's live request count break it; [] when it holds, or
    while requests are in flight. A request's engine side may end one iteration after its reply
    (a stop string aborts it), so callers wait for [] rather than expect it at once."""
    if held["in_flight"]:
        return []
    problems = []
    for key, what in (("running", "admission slots held"), ("waiting", "queue places held"),
                      ("reserved_rids", "request ids reserved")):
        if held[key]:
            problems.append(f"{what} with nothing in flight: {', '.join(held[key][:8])}")
    if engine_requests:
        problems.append(f"{engine_requests} engine requests live with nothing in flight")
    return problems


def check_fits(prompt_tokens: int, max_new: int, context_length: int, bound: str = "") -> None:
    """A 400 when the prompt and max_new_tokens cannot fit the context (`bound`: "at least " when
    the prompt's count is the cheap lower bound taken before tokenizing)."""
    if prompt_tokens + max_new > context_length:
        raise BadRequest(f"prompt ({bound}{prompt_tokens} tokens) + max_new_tokens ({max_new}) exceeds the "
                         f"context length {context_length}")


class Generation:
    """One prompt in flight: its engine request and its SGLang-shaped output so far."""

    def __init__(self, admission: Admission, tokenizer: Tokenizer, item: GenerateInput, *,
                 speculative: bool, context_length: int | None, on_finish: Callable[[RequestOutput], None],
                 launch_num_draft_tokens: int = 1):
        self.admission = admission
        self.updates: queue.Queue[GenUpdate] = queue.Queue()
        sp = item.sampling
        if item.input_ids is None and context_length is not None:
            check_fits(tokenizer.fewest_tokens(item.text or ""), sp.max_new_tokens, context_length, "at least ")
        ids = list(item.input_ids) if item.input_ids is not None else tokenizer.encode(item.text or "")
        if not ids:
            raise BadRequest("the prompt is empty after tokenization")
        if context_length is not None:
            check_fits(len(ids), sp.max_new_tokens, context_length)
        self.out = RequestOutput(rid=item.rid if item.rid is not None else new_rid(), prompt_tokens=len(ids),
                                 sampling=sp, decode=tokenizer.decode, speculative=speculative,
                                 launch_num_draft_tokens=launch_num_draft_tokens)
        self.rid = self.out.rid
        self.admitted = False
        self.on_finish = on_finish
        self.req = GenRequest(rid=self.out.rid, input_ids=ids, max_new_tokens=sp.max_new_tokens,
                              temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                              stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos,
                              seed=sp.sampling_seed, simulate_accept=sp.simulate_accept)
        self.submitted = False
        self.engine_done = False
        self.started = False
        self._reported = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Reserve the id (unless `run_all` did, for the whole batch) and join the queue.

        Raises:
            BadRequest: the id is already in flight (nothing started).
        """
        if not self.admitted:
            self.admission.admit([self])
        self.started = True
        if self.req.max_new_tokens == 0:
            # Nothing to generate: answer at once, as SGLang does for max_new_tokens 0.
            self.out.add([], finished=True, reason="length")
            self.engine_done = True
            self.admission.leave(self)
            self._report()
            return
        self.admission.enter(self)

    def submit_now(self) -> None:
        with self._lock:
            if self.engine_done:  # cancelled while it waited
                return
            self.submitted = True
        try:
            self.admission.engine.submit(self.req, self._on_update)
        except BaseException:
            # It never reached the engine, so no final update will free the slot: free it here.
            with self._lock:
                self.engine_done = True
            self.admission.leave(self)
            raise

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
                               matched=u.matched, spec=u.spec, message=u.error, forward_entry=u.forward_entry)
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
    if gens:
        gens[0].admission.admit(gens)   # every id of the batch at once, or a 400 and nothing runs
    try:
        for g in gens:
            g.start()
        end = time.monotonic() + deadline_s
        for g in gens:
            while not g.out.finished:
                g.step(timeout=max(0.0, end - time.monotonic()))
    except BaseException:
        # Started or not: cancel frees the slot or queue place and releases the id.
        for g in gens:
            g.cancel("request failed")
        raise
    return [g.out for g in gens]


def reply_dicts(outs: list[RequestOutput], batch: bool) -> Any:
    replies = [o.generate_reply() for o in outs]
    return replies if batch else replies[0]
