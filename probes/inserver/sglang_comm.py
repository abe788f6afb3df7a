"""What the SGLang plugin says about the TP group's collectives: which all-reduce path each
decode-sized call takes, and how many collectives each forward issues (computed, not counted).

SGLang picks an all-reduce backend per call, by size: custom all-reduce, then FlashInfer PCIe-IPC,
quick, mscclpp, torch symm-mem, NCCL last (`GroupCoordinator._resolve_outplace_all_reduce_method`,
distributed/parallel_state.py:949-993; None means NCCL). The plugin asks that method itself, on
the `tp` group, for a bf16 `rows x hidden` tensor at each captured batch size, where rows are the
batch for a draft forward and batch x draft tokens for verify and draft-extend. One exception: a
PCIe-IPC communicator builds its workspace on its first eligible tensor, on every rank together
(pcie_ipc_ar.py:231-260), so while it has none it is not asked; its size bound is applied here
instead (the decode width SGLang derives, `max_bs x draft_tokens x hidden`, pcie_ipc_ar.py:134-160).

The collective count per forward walks a model's module tree (llama.py, llama_eagle3.py,
sglang-draft-placement.md §1a): each row-parallel linear is one all-reduce (in the layer, or at the
layer boundary that fuses it with the norm), a vocab-parallel embedding (not the LM head) one
all-reduce, and the logits one all-gather, each only when the layer's TP size is above 1. On
SGLang the collectives run inside CUDA graphs, where hooks cannot count them live: these numbers
are labelled "computed".

Duck-typed over SGLang's objects (names checked by the contract tests) and never raises into the
server: the plugin calls these from a /server_info hook and leaves the keys out on any error. Must
not import SGLang; torch is passed in.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

COMMUNICATORS = ("ca_comm", "pcie_ipc_comm", "qr_comm", "pymscclpp_comm", "torch_symm_mem_comm")
NCCL = "nccl"           # what SGLang's None (and pynccl) mean for these calls
PCIE_WORLD_SIZES = (2, 4, 8)   # pcie_ipc_ar.py:84


def communicators(group: Any) -> dict[str, dict[str, Any]]:
    """Each communicator of the group: present, disabled, and PCIe-IPC's size bound."""
    out: dict[str, dict[str, Any]] = {}
    for name in COMMUNICATORS:
        comm = getattr(group, name, None)
        entry: dict[str, Any] = {"present": comm is not None,
                                 "disabled": bool(getattr(comm, "disabled", True)) if comm is not None else True}
        if name == "pcie_ipc_comm" and comm is not None:
            entry["max_numel"] = int(getattr(comm, "max_numel", 0) or 0)
            entry["workspace"] = getattr(comm, "_workspace", None) is not None
        out[name] = entry
    return out


def _pcie_unbuilt(group: Any) -> bool:
    comm = getattr(group, "pcie_ipc_comm", None)
    return comm is not None and not getattr(comm, "disabled", True) and getattr(comm, "_workspace", None) is None


def path_for(group: Any, tensor: Any, decode_bound: int | None) -> str:
    """The all-reduce path SGLang takes for `tensor` on `group` ("ca", "pcie_ipc", ..., "nccl")."""
    if _pcie_unbuilt(group):
        # Asking would build the workspace on this rank alone; decide as SGLang will once built:
        # every backend before it as SGLang asks them, then its bound.
        ca = getattr(group, "ca_comm", None)
        if ca is not None and not ca.disabled and ca.should_custom_ar(tensor):
            return "ca"
        if decode_bound is not None and tensor.numel() <= decode_bound:
            return "pcie_ipc"
        return NCCL
    method = group._resolve_outplace_all_reduce_method(tensor)
    return NCCL if method in (None, "pynccl") else str(method)


def allreduce_report(group: Any, hidden: int, graph_bs: Iterable[int], draft_tokens: int,
                     probe: Callable[[int], Any], *, full_nvlink: bool | None,
                     env_pcie_ipc: bool, deterministic: bool) -> dict[str, Any]:
    """The `tp` group's all-reduce paths, as the plugin publishes them.

    probe(rows): a contiguous bf16 (rows, hidden) tensor on the group's device."""
    sizes = sorted({int(b) for b in graph_bs})
    bound = (max(sizes) * draft_tokens * hidden) if sizes else None
    paths: dict[str, dict[str, str]] = {"draft": {}, "verify": {}}
    for bs in sizes:
        paths["draft"][str(bs)] = path_for(group, probe(bs), bound)
        paths["verify"][str(bs)] = path_for(group, probe(bs * draft_tokens), bound)
    return {
        "group": "tp", "world_size": int(getattr(group, "world_size", 0) or 0), "hidden": int(hidden),
        "draft_tokens": int(draft_tokens), "full_nvlink": full_nvlink,
        "pcie_ipc_env": bool(env_pcie_ipc), "deterministic": bool(deterministic),
        "communicators": communicators(group), "paths": paths,
    }


def _mro_names(module: Any) -> set[str]:
    return {c.__name__ for c in type(module).__mro__}


def _tp_of(m: Any) -> int:
    """A layer's TP width: VocabParallelEmbedding keeps `tp_size` (vocab_parallel_embedding.py:
    258-267); a linear layer keeps its full and per-rank input sizes (linear.py:1597-1611)."""
    tp = getattr(m, "tp_size", None)
    if isinstance(tp, int) and not isinstance(tp, bool):
        return tp
    full, part = getattr(m, "input_size", None), getattr(m, "input_size_per_partition", None)
    if isinstance(full, int) and isinstance(part, int) and part > 0:
        return max(1, full // part)
    return 1


def collectives_per_forward(model: Any) -> dict[str, int]:
    """All-reduces and all-gathers one forward of `model` issues on its TP group (computed from
    the module tree; see the module docstring)."""
    all_reduce = all_gather = 0
    for m in model.modules():
        names = _mro_names(m)
        if "LogitsProcessor" in names:
            # its own flag says whether the logits are gathered (logits_processor.py:477-489)
            all_gather += 1 if getattr(m, "do_tensor_parallel_all_gather", False) else 0
        elif "RowParallelLinear" in names and _tp_of(m) > 1:
            all_reduce += 1
        elif "VocabParallelEmbedding" in names and "ParallelLMHead" not in names and _tp_of(m) > 1:
            all_reduce += 1
    return {"all_reduce": all_reduce, "all_gather": all_gather}


def per_phase(draft: dict[str, int], target: dict[str, int], steps: int) -> dict[str, dict[str, int]]:
    """Collectives per decode iteration and phase at `steps`: steps - 1 draft forwards, one target
    verify forward, one draft-extend forward (eagle_worker_v2.py:808-820; tier 0 runs no draft)."""
    n = max(0, steps - 1)
    return {
        "draft": {k: v * n for k, v in draft.items()},
        "verify": dict(target),
        "draft_extend": dict(draft),
    }
