"""SGLang 0.5.23's own code as the judge of what the engine's server answers.

Compiles the wheel's definitions (tests/sglang/sglang_wheel_code.py) so a conformance row computes
its expected value with SGLang's code instead of a re-implementation: the per-request spec
statistics (`TokenizerManager._calculate_spec_decoding_metrics`) and the OpenAI completion models
(`protocol.py`), serialised by pydantic exactly as SGLang's routes do. Test-only; must not start
servers.
"""

from __future__ import annotations

import json
import types
from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.sglang.sglang_wheel_code import load_definitions, load_method

TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager"
PROTOCOL = "sglang.srt.entrypoints.openai.protocol"
COMPLETION_MODELS = ["LogProbs", "CachedTokensDetails", "PromptTokensDetails", "CompletionTokensDetails",
                     "UsageInfo", "SpecTokensDetails", "SglExt", "CompletionResponseChoice", "CompletionResponse",
                     "CompletionResponseStreamChoice", "CompletionStreamResponse"]


@lru_cache(maxsize=None)
def _spec_metrics_fn(src: Path):
    # Stubs, named at the call site: `get_spec()` is the tokenizer process's launch config (only
    # speculative_num_draft_tokens is read); `_ragged_verify_cap_accept` gates a block-accept key
    # for a verify mode the engine does not have (off, as on a default launch).
    return load_method(src, TOKENIZER_MANAGER, "TokenizerManager", "_calculate_spec_decoding_metrics",
                       {"_ragged_verify_cap_accept": lambda: False, "Dict": dict, "Any": Any, "Union": Any,
                        "BatchStrOutput": Any, "BatchEmbeddingOutput": Any, "BatchTokenIDOutput": Any})


def spec_meta(src: Path, *, launch_num_draft_tokens: int, verify_ct: int, correct: int, completion: int,
              histogram: list[int]) -> dict[str, Any]:
    """The spec keys SGLang's tokenizer manager puts in a finished request's meta_info, from the
    scheduler's per-request counts (what BatchStrOutput carries for request 0)."""
    fn = _spec_metrics_fn(src)
    spec = types.SimpleNamespace(speculative_num_draft_tokens=launch_num_draft_tokens)
    fn.__globals__["get_spec"] = lambda: spec
    recv = types.SimpleNamespace(spec_verify_ct=[verify_ct], spec_num_correct_drafts=[correct],
                                 completion_tokens=[completion], spec_num_cap_tokens=None,
                                 spec_num_block_accept_tokens=None,
                                 spec_correct_drafts_histogram=[list(histogram)], spec_cap_lens_histogram=None)
    meta: dict[str, Any] = {}
    fn(None, meta, recv, 0)
    return meta


@lru_cache(maxsize=None)
def protocol_models(src: Path) -> types.ModuleType:
    """The completion models of protocol.py, compiled with the real pydantic (its other imports,
    openai's types, msgspec and xgrammar, are for models these do not use)."""
    import pydantic

    provided = {n: getattr(pydantic, n) for n in ("BaseModel", "ConfigDict", "Field", "PrivateAttr", "StrictBool",
                                                    "AfterValidator", "field_serializer", "field_validator",
                                                    "model_serializer", "model_validator")}
    return load_definitions(src, PROTOCOL, COMPLETION_MODELS, provided, register_as="sglang_judge_protocol")


def completion_stream_chunk(src: Path, chunk: dict[str, Any], exclude_none: bool = False) -> dict[str, Any]:
    """`chunk` validated by SGLang's CompletionStreamResponse and written back the way
    serving_completions.py writes it: `model_dump_json()` for choice and sglext chunks,
    `exclude_none=True` for the usage chunk (:454-496)."""
    return json.loads(protocol_models(src).CompletionStreamResponse(**chunk).model_dump_json(
        exclude_none=exclude_none))


def completion_response(src: Path, reply: dict[str, Any]) -> dict[str, Any]:
    """`reply` through SGLang's CompletionResponse as its non-streamed route returns it (FastAPI
    serialises the model with model_dump)."""
    return json.loads(protocol_models(src).CompletionResponse(**reply).model_dump_json())
