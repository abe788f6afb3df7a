"""Validation of request bodies (/generate, /v1/completions, /set_internal_state, phase-stream query).

Turns untrusted JSON into typed values or raises BadRequest with a one-line message naming the field.
Pure: must not touch the engine, sockets or the tokenizer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from probes.names import ADAPTIVE_CONFIG, PINNED_STEPS, PLACEMENT, PLACEMENTS
from refengine.config import CONFIG_KEYS
from refengine.messages import MAX_SIMULATE_POSITIONS

# SGLang's SamplingParams / GenerateReqInput defaults.
DEFAULT_MAX_NEW_TOKENS = 128
OPENAI_DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 16 << 20
# Bounds of the integers that end up in the ranks' tensors (torch.long / a generator's seed): a
# value past them is a 400 naming the field here, never an overflow inside a rank.
INT64_MAX = 2**63 - 1
# top_k beyond any vocabulary means "off"; SGLang's samplers hold it in an int32 tensor.
MAX_TOP_K = 2**31 - 1
# What /set_internal_state takes: the knobs this engine supports (a subset of probes.names.KNOBS:
# another, SGLang's alone, is refused by name as SGLang refuses a key it lacks), SGLang's adaptive
# config (null removes it) and the SGLang plugin's tier pin.
SETTABLE = (*CONFIG_KEYS, ADAPTIVE_CONFIG, PINNED_STEPS)


# The error type SGLang's OpenAI routes give a body its pydantic models refuse (a missing or
# mistyped field, max_tokens <= 0: http_server.py:635-690), beside "BadRequestError" for what
# its serving code refuses.
SCHEMA_ERROR = "Bad Request"


class BadRequest(ValueError):
    """A 4xx: the message is shown to the client as is."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type


def _set(v: Any) -> bool:
    return v is not None and v is not False and v != [] and v != {} and v != ""


def _not(*defaults: Any) -> Callable[[Any], bool]:
    return lambda v: v is not None and v not in defaults


# Field -> "is this value a request for something the engine does not do", for every route: the
# chat body, a /generate `sampling_params` and a /v1/completions body. SGLang serves all of them
# (SamplingParams, sampling/sampling_params.py:149-189; CompletionRequest, protocol.py:365-455;
# ChatCompletionRequest, :909-1060); the reference engine has no tool parser, grammar backend,
# logprobs, penalties or min-token floor, so answering 200 without them would hand back something
# other than what was asked. A field at its default value is accepted.
UNSUPPORTED: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("tools", _set),
    ("tool_choice", _not("none", "auto")),
    ("response_format", lambda v: v is not None and not (isinstance(v, dict) and v.get("type") == "text")),
    ("n", _not(1)),
    ("logprobs", _set),
    ("top_logprobs", _not(0)),
    ("logit_bias", _set),
    ("frequency_penalty", _not(0, 0.0)),
    ("presence_penalty", _not(0, 0.0)),
    ("repetition_penalty", _not(1, 1.0)),
    ("min_p", _not(0, 0.0)),
    ("min_tokens", _not(0)),
    ("min_new_tokens", _not(0)),
    ("regex", _set),
    ("json_schema", _set),
    ("ebnf", _set),
    ("structural_tag", _set),
    ("stop_regex", _set),
    ("no_stop_trim", _set),
    ("beam_width", _not(0, 1)),
    ("custom_params", _set),
    ("custom_logit_processor", _set),
    ("watermark", _set),
    ("return_hidden_states", _set),
    ("continue_final_message", _set),
    ("lora_path", _set),
)


def refuse_unsupported(body: dict) -> None:
    """A 400 naming the first field of `body` that asks for something the engine does not do."""
    for name, asks in UNSUPPORTED:
        if name in body and asks(body[name]):
            raise BadRequest(f"{name} is not supported by the reference engine (got {short_value(body[name])})")


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    sampling_seed: int | None = None     # SGLang's name; None = derived from the engine seed and rid
    simulate_accept: tuple[float, ...] = ()   # this engine's own: per-request acceptance for the simulator


@dataclass(frozen=True)
class GenerateInput:
    """One prompt of a /generate (or /v1/completions) request."""
    text: str | None
    input_ids: tuple[int, ...] | None
    sampling: Sampling
    rid: str | None = None


@dataclass(frozen=True)
class GenerateBatch:
    items: list[GenerateInput]
    batch: bool                      # the client sent lists, so the reply is a list
    stream: bool = False
    extras: dict[str, Any] = field(default_factory=dict)


# Deeper bodies are refused before parsing: json.loads recurses per level and would raise
# RecursionError (a 500) near 1000; orjson, behind SGLang, stops at 1024; nothing a client sends needs this many.
MAX_JSON_DEPTH = 512


def _too_deep(raw: bytes) -> bool:
    """True if brackets nest deeper than MAX_JSON_DEPTH outside strings (a linear scan, no parse)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False  # the common case, at C speed: too few brackets to nest that deep
    depth = 0
    in_str = escaped = False
    for b in raw:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif b in (0x5D, 0x7D):
            depth -= 1
    return False


def _lone_surrogate(obj: Any) -> str | None:
    """The path of the first string holding a lone UTF-16 surrogate (JSON's "\\ud800" escapes
    decode to one; it is not text and the tokenizer cannot take it), or None."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(v, dict):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
            for k in v:
                if isinstance(k, str):
                    stack.append((f"{path}.<key>" if path else "<key>", k))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
    return None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> Any:
    if not raw:
        return {}
    if _too_deep(raw):
        raise BadRequest(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        obj = json.loads(raw)
    except ValueError as e:
        # JSONDecodeError, UnicodeDecodeError, and an integer literal past Python's 4300-digit
        # limit: every one is the client's body, so a 400.
        raise BadRequest(f"malformed JSON body: {e}") from None
    except RecursionError:
        raise BadRequest(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    # Surrogates can only arrive as \\u escapes (UTF-8 bytes cannot encode one: those fail to
    # decode above), so bodies without such an escape skip the walk.
    bad = _lone_surrogate(obj) if _SURROGATE_ESCAPE.search(raw) else None
    if bad is not None:
        raise BadRequest(f"{bad}: a lone UTF-16 surrogate (\\ud800-\\udfff) is not valid text")
    return obj


def stream_options(body: dict) -> bool:
    """`stream_options.include_usage` (SGLang utils.py:250-264; its server default is off)."""
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise BadRequest("stream_options: expected an object")
    v = so.get("include_usage", False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"stream_options.include_usage: expected true or false, got {short_value(v)}")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def short_value(v: Any) -> str:
    """A client's value for an error message, cut: a 4000-digit integer must not come back whole."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _ids(v: Any, name: str, vocab_size: int | None) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(_is_int(i) for i in v):
        raise BadRequest(f"{name}: expected a non-empty list of token ids")
    bad = [i for i in v if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        raise BadRequest(f"{name}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    return tuple(v)


def parse_sampling(sp: Any, *, default_max: int = DEFAULT_MAX_NEW_TOKENS, max_name: str = "max_new_tokens",
                   seed_name: str = "sampling_seed") -> Sampling:
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params: expected an object")
    refuse_unsupported(sp)
    mx = sp.get(max_name, default_max)
    if mx is None:
        mx = default_max
    if not _is_int(mx) or not 0 <= mx <= INT64_MAX:
        raise BadRequest(f"{max_name}: expected an integer in 0..{INT64_MAX}, got {short_value(mx)}")
    temp = sp.get("temperature", 1.0)
    if not _is_num(temp) or temp < 0:
        raise BadRequest(f"temperature: expected a number >= 0, got {short_value(temp)}")
    top_p = sp.get("top_p", 1.0)
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise BadRequest(f"top_p: expected a number in (0, 1], got {short_value(top_p)}")
    top_k = sp.get("top_k", -1)
    if not _is_int(top_k) or not (top_k in (-1, 0) or 1 <= top_k <= MAX_TOP_K):
        raise BadRequest(f"top_k: expected -1 (off) or an integer in 1..{MAX_TOP_K}, got {short_value(top_k)}")
    ignore_eos = sp.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"ignore_eos: expected true or false, got {short_value(ignore_eos)}")
    stop = sp.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop: expected a non-empty string or a list of them")
    stop_ids = sp.get("stop_token_ids") or ()
    if not isinstance(stop_ids, (list, tuple)) or not all(_is_int(i) for i in stop_ids):
        raise BadRequest("stop_token_ids: expected a list of integers")
    if any(not -INT64_MAX - 1 <= i <= INT64_MAX for i in stop_ids):
        raise BadRequest("stop_token_ids: expected integers within int64 (±2^63)")
    seed = sp.get(seed_name)
    if seed is not None and (not _is_int(seed) or not 0 <= seed <= INT64_MAX):
        raise BadRequest(f"{seed_name}: expected an integer in 0..{INT64_MAX}, got {short_value(seed)}")
    sim = sp.get("simulate_accept") or ()
    if (not isinstance(sim, (list, tuple)) or len(sim) > MAX_SIMULATE_POSITIONS
            or not all(_is_num(a) and 0 <= a <= 1 for a in sim)):
        raise BadRequest(f"simulate_accept: expected a list of at most {MAX_SIMULATE_POSITIONS} "
                         f"probabilities in [0, 1], got {short_value(sim)}")
    return Sampling(max_new_tokens=mx, temperature=float(temp), top_p=float(top_p),
                    top_k=-1 if top_k == 0 else top_k, ignore_eos=ignore_eos,
                    stop=tuple(stop), stop_token_ids=tuple(stop_ids), sampling_seed=seed,
                    simulate_accept=tuple(float(a) for a in sim))


def _bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{name}: expected true or false, got {short_value(v)}")
    return v


def _prompts(text: Any, input_ids: Any, vocab_size: int | None, text_name: str = "text") -> tuple[list, bool]:
    """-> ([(text|None, ids|None)], is_batch)."""
    if (text is None) == (input_ids is None):
        raise BadRequest(f"exactly one of {text_name} or input_ids is required")
    if text is not None:
        if isinstance(text, str):
            return [(text, None)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [(t, None) for t in text], True
        raise BadRequest(f"{text_name}: expected a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and all(isinstance(x, list) for x in input_ids):
        return [(None, _ids(x, "input_ids", vocab_size)) for x in input_ids], True
    return [(None, _ids(input_ids, "input_ids", vocab_size))], False


def parse_generate(body: Any, vocab_size: int | None = None) -> GenerateBatch:
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    # SGLang features this engine lacks: refuse them rather than answer without what was asked.
    for name in ("return_logprob", "return_hidden_states", "input_embeds", "lora_path", "image_data"):
        if body.get(name):
            raise BadRequest(f"{name} is not supported by the reference engine")
    prompts, batch = _prompts(body.get("text"), body.get("input_ids"), vocab_size)
    sps = body.get("sampling_params")
    if isinstance(sps, list):
        if len(sps) != len(prompts):
            raise BadRequest("sampling_params: a list must have one entry per prompt")
        samplings = [parse_sampling(s) for s in sps]
    else:
        samplings = [parse_sampling(sps)] * len(prompts)
    rid = body.get("rid")
    rids: list[str | None]
    if rid is None:
        rids = [None] * len(prompts)
    elif isinstance(rid, str) and not batch:
        rids = [rid]
    elif isinstance(rid, list) and len(rid) == len(prompts) and all(isinstance(r, str) for r in rid):
        rids = list(rid)
    else:
        raise BadRequest("rid: expected a string (or one per prompt)")
    stream = _bool(body, "stream")
    if stream and batch:
        raise BadRequest("streaming a batch is not supported; send one request per prompt")
    items = [GenerateInput(text=t, input_ids=i, sampling=s, rid=r)
             for (t, i), s, r in zip(prompts, samplings, rids)]
    return GenerateBatch(items=items, batch=batch, stream=stream)


def parse_completion(body: Any, vocab_size: int | None = None) -> GenerateBatch:
    """OpenAI /v1/completions with SGLang's extras (top_k, ignore_eos, return_spec_tokens_details)."""
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("prompt is required", err_type=SCHEMA_ERROR)
    if isinstance(prompt, list) and prompt and all(_is_int(x) for x in prompt):
        prompts, batch = _prompts(None, prompt, vocab_size, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(x, list) for x in prompt):
        prompts, batch = _prompts(None, prompt, vocab_size, "prompt")
    else:
        prompts, batch = _prompts(prompt, None, vocab_size, "prompt")
    refuse_unsupported(body)
    for name, asks in (("suffix", _set), ("best_of", _not(1))):
        if asks(body.get(name)):
            raise BadRequest(f"{name} is not supported by the reference engine (got {short_value(body[name])})")
    mx = body.get("max_tokens")
    if _is_int(mx) and mx <= 0:
        # protocol.py:448-453 validate_max_tokens_positive (a pydantic error: 400 in SGLang).
        raise BadRequest("max_tokens must be positive", err_type=SCHEMA_ERROR)
    sampling = parse_sampling(body, default_max=OPENAI_DEFAULT_MAX_TOKENS, max_name="max_tokens", seed_name="seed")
    stream = _bool(body, "stream")
    if stream and batch:
        raise BadRequest("streaming several prompts is not supported; send one request per prompt")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model: expected a string")
    extras = {"model": model, "return_spec_tokens_details": _bool(body, "return_spec_tokens_details"),
              "echo": _bool(body, "echo"), "include_usage": stream_options(body)}
    items = [GenerateInput(text=t, input_ids=i, sampling=sampling) for t, i in prompts]
    return GenerateBatch(items=items, batch=batch, stream=stream, extras=extras)


def parse_internal_state(body: Any) -> dict[str, Any]:
    """SGLang's SetInternalStateReq: {"server_args": {key: value}}; unknown keys are refused."""
    if not isinstance(body, dict) or not isinstance(body.get("server_args"), dict):
        raise BadRequest('expected {"server_args": {key: value, ...}}')
    args = body["server_args"]
    if not args:
        raise BadRequest("server_args is empty")
    unknown = [k for k in args if k not in SETTABLE]
    if unknown:
        raise BadRequest(f"Updating {unknown[0]} is not supported. Supported keys: {', '.join(SETTABLE)}")
    for k, v in args.items():
        if k == PLACEMENT:
            if not isinstance(v, str):
                raise BadRequest(f"{k}: expected one of {', '.join(PLACEMENTS)}, got {short_value(v)}")
        elif k == ADAPTIVE_CONFIG:
            if v is not None and not isinstance(v, dict):
                raise BadRequest(f'{k}: expected a config object ({{"1": {{"candidate_steps": [...]}}, ...}}) '
                                 f"or null, got {short_value(v)}")
        elif not (_is_int(v) or (isinstance(v, float) and v.is_integer())):
            raise BadRequest(f"{k}: expected an integer, got {short_value(v)}")
    return {k: (v if k in (PLACEMENT, ADAPTIVE_CONFIG) else int(v)) for k, v in args.items()}


def parse_int_query(query: dict[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    vals = query.get(name)
    if not vals:
        return default
    try:
        v = int(vals[-1])
    except ValueError:
        raise BadRequest(f"{name}: expected an integer, got {short_value(vals[-1])}") from None
    if not lo <= v <= hi:
        raise BadRequest(f"{name}: expected {lo}..{hi}, got {v}")
    return v
