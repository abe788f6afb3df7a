"""torch.compile for the engine's forwards (`serve --enable-torch-compile`, SGLang's switch).

What is compiled, and why that way:
  * every target decoder layer, regionally: the layers share one code object, so Inductor
    compiles one layer per shape and all 32 reuse it (minutes of compile become seconds); the
    whole forward is then captured as one CUDA graph by refengine.graphs — the only graph cache:
    Inductor's own cudagraphs stay off (mode "default" or "max-autotune-no-cudagraphs");
  * the EAGLE-3 head's forward, whole (one small layer plus fc, norm and lm_head), for each
    placement's copy of the head when it is first placed;
  * the greedy chain's per-step glue (refengine.graphs.chain_tail: argmax, id map, the next
    step's inputs and mask), which eager is about a dozen tiny kernels per draft step.
Collectives stay outside compiled code: the Communicator's ops are excluded from tracing, so at
TP > 1 a compiled region ends at each collective and the op runs as before — counted, timed,
labelled with its phase and captured in the CUDA graph like every other kernel. At TP 1 there is
no collective and the layer compiles as one graph (fullgraph; tests check no break on CPU).

Where: only inside the graph cache's bodies (the decode phases: draft steps, verify, draft
extend), as SGLang compiles only what its CUDA graphs capture; prefill (any prompt length) stays
eager, or every new prompt length would compile. With graphs off nothing compiled runs.
Shapes: Dynamo keys compiled code by static shapes (batch bucket, tokens per row), except the
mask's context width, marked dynamic (only the attention op reads it), so a context bucket
never recompiles. `recompiles()` counts compiled graphs: benchmarks fail on any after warm-up.
Must not decide what runs (refengine.engine) nor capture graphs (refengine.graphs).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from refengine.graphs import in_graph_body
from refengine.models.layers import AttnMeta

MODES = ("default", "max-autotune-no-cudagraphs")
BACKENDS = ("inductor", "aot_eager")


def configure_dynamo() -> None:
    """Static shapes with room for every bucket: a new shape compiles a new static graph
    (never a dynamic-shape one), and the per-code-object limit is far above the buckets."""
    cfg = torch._dynamo.config
    cfg.automatic_dynamic_shapes = False
    for name in ("recompile_limit", "cache_size_limit"):     # renamed across torch versions
        if hasattr(cfg, name):
            setattr(cfg, name, 1024)
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = 4096


def compile_forward(module: torch.nn.Module, *, backend: str = "inductor", mode: str | None = "default",
                    fullgraph: bool = False, max_bs: int | None = None) -> torch.nn.Module:
    """Replace module.forward by its compiled form (in place); returns the module.

    The class's forward is bound afresh (a deep copy of a compiled module must not call its
    original's). Compiled code runs only inside graph-cache bodies (refengine.graphs.in_graph_body:
    decode phases, a bounded set of shapes); prefill, catch-up extends, eager fallbacks and calls
    with more than `max_bs` rows (SGLang's --torch-compile-max-bs) run the eager forward.
    Each AttnMeta argument's mask has its context width marked dynamic before the call."""
    eager = type(module).forward.__get__(module)
    options = {} if backend != "inductor" else {"mode": mode}
    compiled = torch.compile(eager, backend=backend, fullgraph=fullgraph, dynamic=False, **options)

    @functools.wraps(eager)
    def forward(*args, **kwargs):
        if not in_graph_body():
            return eager(*args, **kwargs)
        meta = next((a for a in (*args, *kwargs.values()) if isinstance(a, AttnMeta)), None)
        if meta is not None:
            if max_bs is not None and meta.rows.shape[0] > max_bs:
                return eager(*args, **kwargs)
            torch._dynamo.maybe_mark_dynamic(meta.mask, meta.mask.dim() - 1)
        return compiled(*args, **kwargs)
    module.forward = forward
    return module


def compile_chain_tail(*, backend: str = "inductor", mode: str | None = "default") -> Callable:
    """refengine.graphs.chain_tail compiled (fullgraph, static shapes but the mask's context
    width), run only inside graph-cache bodies like every compiled forward."""
    from refengine.graphs import chain_tail

    options = {} if backend != "inductor" else {"mode": mode}
    compiled = torch.compile(chain_tail, backend=backend, fullgraph=True, dynamic=False, **options)

    @functools.wraps(chain_tail)
    def tail(*args):
        if not in_graph_body():
            return chain_tail(*args)
        torch._dynamo.maybe_mark_dynamic(args[-1], args[-1].dim() - 1)
        return compiled(*args)
    return tail


def exclude_collectives(comm) -> None:
    """Keep the Communicator's collectives out of traced code (a compiled region ends there)."""
    for name in ("all_reduce", "all_gather", "broadcast"):
        setattr(comm, name, torch.compiler.disable(getattr(comm, name), recursive=True))


def compile_models(target, comm, mode: str = "default", max_bs: int | None = None,
                   backend: str = "inductor") -> Callable:
    """Compile the target's layers in place; returns the function that compiles a draft head
    (DraftPlacement calls it for each layout's head when it is first placed)."""
    if mode not in MODES:
        raise ValueError(f"torch compile mode must be one of {', '.join(MODES)}, got {mode!r}")
    if backend not in BACKENDS:
        raise ValueError(f"torch compile backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    configure_dynamo()
    exclude_collectives(comm)
    for layer in target.model.layers:
        compile_forward(layer, backend=backend, mode=mode, fullgraph=comm.world == 1, max_bs=max_bs)
    return functools.partial(compile_forward, backend=backend, mode=mode, max_bs=max_bs)


def recompiles() -> int:
    """Graphs Dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])
