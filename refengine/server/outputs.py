"""One request's output as SGLang reports it: cumulative text and output_ids, stop strings, meta_info,
and the OpenAI completion shapes.

Pure bookkeeping over token ids and a decode function; it must not call the engine (the handler
aborts the engine request when `RequestOutput.finished` turns true because of a stop string).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from refengine.messages import SpecStats
from refengine.server.inputs import Sampling


class LatencyObserver(Protocol):
    """Where a request's latency facts go as they happen (the server's Metrics, bound to the
    request's is_streaming)."""

    def first_token(self, ttft_s: float) -> None: ...
    def tokens(self, interval_s: float, new_tokens: int) -> None: ...
    def queued(self, queue_s: float) -> None: ...


@dataclass
class RequestOutput:
    rid: str
    prompt_tokens: int
    sampling: Sampling
    decode: Callable[[list[int]], str]
    speculative: bool = True
    launch_num_draft_tokens: int = 1
    """The server's launch N (speculative_num_draft_tokens at start): SGLang's tokenizer computes
    every request's proposed drafts with it, whatever N the rounds ran (tokenizer_manager.py 3156-3158)."""
    created: float = field(default_factory=time.time)
    first_token_at: float | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: dict[str, Any] | None = None
    spec: SpecStats | None = None
    finished_at: float | None = None
    error: str | None = None
    """Set when the engine failed the request (e.g. a rank died), not when it was merely aborted."""
    latency: LatencyObserver | None = None
    """Told the request's latencies as its outputs arrive; None = not counted (warm-up)."""
    last_output_at: float | None = None
    """When the last output with tokens arrived (SGLang's time_stats.last_time)."""

    def add(self, new_ids: list[int], finished: bool = False, reason: str | None = None,
            matched: int | None = None, spec: SpecStats | None = None, message: str | None = None,
            forward_entry: float | None = None) -> bool:
        """Append the engine's new ids; return True if a stop string/id ended the request here.
        `forward_entry`: when the engine began the request's first forward (its first update)."""
        if self.finished:
            return False
        now = time.time()
        if forward_entry is not None and self.latency is not None:
            self.latency.queued(forward_entry - self.created)
        n_before = len(self.output_ids)
        stopped_here = False
        for tok in new_ids:
            self.output_ids.append(tok)
            # Stop ids and EOS are the engine's; stop strings need the text, so they are ours.
            if self.sampling.stop and self._stop_string_hit():
                stopped_here = True
                break
        self._time_output(now, len(self.output_ids) - n_before, reason)
        if spec is not None:
            self.spec = spec
        if not self.finished:
            self.text = self._visible_text(final=finished)
            if finished:
                self._finish(self._engine_reason(reason, matched, message))
        return stopped_here

    def _time_output(self, now: float, new: int, reason: str | None) -> None:
        """SGLang's collect_metrics (tokenizer_manager.py:3235-3259): the first output that is not
        an abort gives the time to first token; each later one its interval, spread over its new
        tokens. An output without tokens moves nothing."""
        if new <= 0:
            return
        if self.first_token_at is None:
            self.first_token_at = self.last_output_at = now
            if self.latency is not None and reason not in ("abort", "error"):
                self.latency.first_token(now - self.created)
            return
        if self.latency is not None:
            self.latency.tokens(now - (self.last_output_at or now), new)
        self.last_output_at = now

    def time_per_output_token(self) -> float | None:
        """SGLang's TPOT of a finished request (req_time_stats.py:492-498; only for stop and
        length, tokenizer_manager.py:3277-3284): decode time / (completion tokens - 1)."""
        if not self.finished or (self.finish_reason or {}).get("type") not in ("stop", "length"):
            return None
        n = len(self.output_ids)
        if self.first_token_at is None or self.finished_at is None or n <= 1:
            return None
        decode = self.finished_at - self.first_token_at
        return decode / (n - 1) if decode > 0 else None

    def _stop_string_hit(self) -> bool:
        text = self.decode(self.output_ids)
        hits = [(text.find(s), s) for s in self.sampling.stop if s in text]
        if not hits:
            return False
        pos, matched = min(hits)
        self.text = text[:pos]  # SGLang trims the stop string from the text
        self._finish({"type": "stop", "matched": matched})
        return True

    def _visible_text(self, final: bool) -> str:
        text = self.decode(self.output_ids)
        # Hold back a half-decoded multi-byte character until its last byte arrives.
        return text if final else text.rstrip("\ufffd")

    def _engine_reason(self, reason: str | None, matched: int | None, message: str | None) -> dict[str, Any]:
        if reason == "length":
            return {"type": "length", "length": self.sampling.max_new_tokens}
        # SGLang's FINISH_ABORT.to_json (schedule_batch.py 339-345): message, status_code, err_type.
        if reason == "error":
            self.error = message or "engine error"
            return abort_reason(message or "engine error", 503, "ServiceUnavailable")
        if reason == "abort":
            return abort_reason(message or "Aborted")
        return {"type": "stop", "matched": matched}

    def _finish(self, reason: dict[str, Any]) -> None:
        self.finished = True
        self.finish_reason = reason
        self.finished_at = time.time()

    # ----- SGLang shapes -------------------------------------------------------------------------

    def meta_spec(self) -> dict[str, Any]:
        """The spec keys of meta_info exactly as SGLang 0.5.23 computes them
        (TokenizerManager._calculate_spec_decoding_metrics, tokenizer_manager.py 3138-3201): none
        without verify rounds (tier-0 rounds count: each is a one-token verify); proposed =
        spec_verify_ct x (launch N - 1), so after a live change of N, or at tier 0, the counts and
        the rate are SGLang's, not the rounds' (meta_specdecode has those); rate, length and counts
        when that product is positive; the histogram when it is not empty. The statistics are those
        of the tokens returned: a stop string keeps the rounds up to the one that produced it."""
        s = self.spec
        if s is None or s.spec_verify_ct <= 0:
            return {}
        out: dict[str, Any] = {}
        proposed = s.spec_verify_ct * (self.launch_num_draft_tokens - 1)
        if proposed > 0:
            out.update(spec_accept_rate=s.spec_num_correct_drafts / proposed,
                       spec_accept_length=len(self.output_ids) / s.spec_verify_ct,
                       spec_num_correct_drafts=s.spec_num_correct_drafts,
                       spec_num_proposed_drafts=proposed,
                       spec_verify_ct=s.spec_verify_ct)
        if s.spec_correct_drafts_histogram:
            out["spec_correct_drafts_histogram"] = list(s.spec_correct_drafts_histogram)
        return out

    def meta_specdecode(self) -> dict[str, Any]:
        """Our per-round truth beside SGLang's keys (an SGLang client ignores them): proposed =
        the sum over verify rounds of the N that round ran, minus 1 (0 at tier 0), and the rate
        over that. Present whenever there were verify rounds."""
        s = self.spec
        if s is None or s.spec_verify_ct <= 0:
            return {}
        return {"specdecode_verify_ct": s.spec_verify_ct,
                "specdecode_num_correct_drafts": s.spec_num_correct_drafts,
                "specdecode_num_proposed_drafts": s.spec_num_proposed_drafts,
                "specdecode_accept_rate": (s.spec_num_correct_drafts / s.spec_num_proposed_drafts
                                           if s.spec_num_proposed_drafts else 0.0)}

    def meta_info(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": 0,
        }
        if self.finished:
            meta["e2e_latency"] = (self.finished_at or time.time()) - self.created
            if self.speculative:
                meta.update(self.meta_spec())
                meta.update(self.meta_specdecode())
        return meta

    def generate_reply(self) -> dict[str, Any]:
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self.meta_info()}


def abort_reason(message: str, status_code: int | None = None, err_type: str | None = None) -> dict[str, Any]:
    """SGLang's abort finish reason; a plain abort (client gone, cancelled) has no status."""
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


def new_rid() -> str:
    return uuid.uuid4().hex


def openai_finish_reason(reason: dict[str, Any] | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason.get("type") == "length" else ("abort" if reason.get("type") == "abort" else "stop")


def completion_choice(out: RequestOutput, index: int, text: str) -> dict[str, Any]:
    matched = (out.finish_reason or {}).get("matched") if out.finished else None
    return {"index": index, "text": text, "logprobs": None,
            "finish_reason": openai_finish_reason(out.finish_reason) if out.finished else None,
            "matched_stop": matched}


def completion_reply(cid: str, model: str, outs: list[RequestOutput], echo_prompts: list[str] | None) -> dict[str, Any]:
    choices = [completion_choice(o, i, (echo_prompts[i] if echo_prompts else "") + o.text)
               for i, o in enumerate(outs)]
    prompt_tokens = sum(o.prompt_tokens for o in outs)
    completion_tokens = sum(len(o.output_ids) for o in outs)
    reply: dict[str, Any] = {
        "id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }
    return reply
