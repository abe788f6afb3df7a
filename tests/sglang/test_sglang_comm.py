"""The plugin's all-reduce report and collective counts (probes/inserver/sglang_comm) against
SGLang 0.5.23's own code: `GroupCoordinator._resolve_outplace_all_reduce_method` compiled from the
wheel (sglang_wheel_code.load_method) decides each path. What is a stand-in (the communicators need
GPUs, FlashInfer and NCCL): the group object and its communicators, whose `should_*` answers are
scripted per test, and the model trees, torch modules named as SGLang's layer classes with the
attributes the count reads (the contract test below checks those names in the wheel)."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch

from probes.inserver.sglang_comm import allreduce_report, collectives_per_forward, per_phase
from sglang_wheel_code import load_method, methods, parse, self_attrs, top_level

PS = "sglang.srt.distributed.parallel_state"


@pytest.fixture(scope="module")
def resolve(sglang_target):
    # is_in_tc_piecewise_cuda_graph: a stand-in for SGLang's piecewise-graph flag (off here)
    return load_method(sglang_target / "sglang", PS, "GroupCoordinator", "_resolve_outplace_all_reduce_method",
                       {"is_in_tc_piecewise_cuda_graph": lambda: False, "torch": torch})


class _Comm:
    def __init__(self, takes=lambda t: True, disabled=False, **kw):
        self.disabled, self._takes = disabled, takes
        self.__dict__.update(kw)

    def should_custom_ar(self, t):
        return self._takes(t)

    def should_pcie_ipc_ar(self, t):
        return self._takes(t)


def _group(resolve, **comms):
    g = SimpleNamespace(**{"world_size": 8, "ca_comm": None, "pcie_ipc_comm": None, "qr_comm": None,
                           "pymscclpp_comm": None, "torch_symm_mem_comm": None, "pynccl_comm": object(), **comms})
    g._resolve_outplace_all_reduce_method = lambda t, **kw: resolve(g, t, **kw)
    return g


def _probe(hidden):
    return lambda rows: torch.empty((rows, hidden), dtype=torch.bfloat16)


def test_pcie_only_nccl_launch_reports_nccl_everywhere(resolve):
    # 8 PCIe GPUs, no env: custom all-reduce disabled (more than 2 PCIe-only GPUs), no PCIe-IPC
    g = _group(resolve, ca_comm=_Comm(disabled=True, full_nvlink=False))
    r = allreduce_report(g, 4096, [1, 2, 4, 8], 4, _probe(4096), full_nvlink=False, env_pcie_ipc=False,
                         deterministic=False)
    assert set(r["paths"]["draft"].values()) == {"nccl"} and set(r["paths"]["verify"].values()) == {"nccl"}
    assert r["communicators"]["ca_comm"] == {"present": True, "disabled": True}
    assert r["communicators"]["pcie_ipc_comm"]["present"] is False and r["world_size"] == 8


def test_pcie_ipc_with_a_built_workspace_is_asked_and_bounded(resolve):
    bound = 8 * 4 * 4096
    ipc = _Comm(takes=lambda t: t.numel() <= bound, max_numel=bound, _workspace=object())
    g = _group(resolve, ca_comm=_Comm(disabled=True), pcie_ipc_comm=ipc)
    r = allreduce_report(g, 4096, [1, 8, 16], 4, _probe(4096), full_nvlink=False, env_pcie_ipc=True,
                         deterministic=False)
    assert r["paths"]["draft"] == {"1": "pcie_ipc", "8": "pcie_ipc", "16": "pcie_ipc"}
    assert r["paths"]["verify"]["8"] == "pcie_ipc" and r["paths"]["verify"]["16"] == "nccl"   # 64 rows > 32
    assert r["communicators"]["pcie_ipc_comm"] == {"present": True, "disabled": False, "max_numel": bound,
                                                   "workspace": True}


def test_an_unbuilt_pcie_ipc_workspace_is_never_asked(resolve):
    def boom(t):
        raise AssertionError("asked the communicator before its workspace exists")
    g = _group(resolve, ca_comm=_Comm(disabled=True), pcie_ipc_comm=_Comm(takes=boom, max_numel=0, _workspace=None))
    r = allreduce_report(g, 1024, [1, 4], 2, _probe(1024), full_nvlink=False, env_pcie_ipc=True,
                         deterministic=False)
    assert r["paths"]["draft"] == {"1": "pcie_ipc", "4": "pcie_ipc"}       # within max_bs x N x hidden


def test_custom_all_reduce_comes_first_on_nvlink(resolve):
    g = _group(resolve, ca_comm=_Comm(full_nvlink=True), pcie_ipc_comm=_Comm(_workspace=object(), max_numel=1 << 30))
    r = allreduce_report(g, 1024, [1], 2, _probe(1024), full_nvlink=True, env_pcie_ipc=True, deterministic=False)
    assert r["paths"]["draft"]["1"] == "ca" and r["full_nvlink"] is True


class RowParallelLinear(torch.nn.Module):
    def __init__(self, tp):
        super().__init__()
        self.input_size, self.input_size_per_partition = 64, 64 // tp


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, tp):
        super().__init__()
        self.tp_size = tp


class ParallelLMHead(VocabParallelEmbedding):
    pass


class LogitsProcessor(torch.nn.Module):
    def __init__(self, tp):
        super().__init__()
        self.do_tensor_parallel_all_gather = tp > 1


def _llama(layers, tp):
    m = torch.nn.Module()
    m.embed = VocabParallelEmbedding(tp)
    m.layers = torch.nn.ModuleList()
    for _ in range(layers):
        layer = torch.nn.Module()
        layer.o_proj, layer.down_proj = RowParallelLinear(tp), RowParallelLinear(tp)
        m.layers.append(layer)
    m.lm_head, m.logits = ParallelLMHead(tp), LogitsProcessor(tp)
    return m


def test_collectives_per_forward_and_per_phase():
    target, draft = collectives_per_forward(_llama(32, 8)), collectives_per_forward(_llama(1, 8))
    assert target == {"all_reduce": 65, "all_gather": 1}         # 2 per layer + the embedding
    assert draft == {"all_reduce": 3, "all_gather": 1}           # sglang-draft-placement.md §1a
    assert collectives_per_forward(_llama(2, 1)) == {"all_reduce": 0, "all_gather": 0}
    ph = per_phase(draft, target, steps=3)
    assert ph["draft"] == {"all_reduce": 6, "all_gather": 2} and ph["draft_extend"] == draft
    assert per_phase(draft, target, steps=0)["draft"] == {"all_reduce": 0, "all_gather": 0}


_attrs = self_attrs


def test_the_names_the_report_reads_exist_in_the_wheel(sglang_src):
    ps = top_level(parse(sglang_src, PS))
    assert "get_tp_group" in ps
    gc = _attrs(ps["GroupCoordinator"])
    assert {"ca_comm", "pcie_ipc_comm", "qr_comm", "pymscclpp_comm", "torch_symm_mem_comm", "world_size",
            "_resolve_outplace_all_reduce_method"} <= gc
    dc = "sglang.srt.distributed.device_communicators."
    assert {"disabled", "max_numel", "_workspace", "should_pcie_ipc_ar"} <= _attrs(
        top_level(parse(sglang_src, dc + "pcie_ipc_ar"))["PcieIpcCommunicator"])
    assert {"full_nvlink", "disabled", "should_custom_ar"} <= _attrs(
        top_level(parse(sglang_src, dc + "custom_all_reduce"))["CustomAllreduce"])
    lin = top_level(parse(sglang_src, "sglang.srt.layers.linear"))
    assert "input_size" in _attrs(lin["LinearBase"]) and "input_size_per_partition" in _attrs(lin["RowParallelLinear"])
    vpe = top_level(parse(sglang_src, "sglang.srt.layers.vocab_parallel_embedding"))
    assert "tp_size" in _attrs(vpe["VocabParallelEmbedding"])
    assert [ast.unparse(b) for b in vpe["ParallelLMHead"].bases] == ["VocabParallelEmbedding"]
    lp = top_level(parse(sglang_src, "sglang.srt.layers.logits_processor"))
    assert "do_tensor_parallel_all_gather" in _attrs(lp["LogitsProcessor"])
    runner = top_level(parse(sglang_src, "sglang.srt.model_executor.runner.decode_cuda_graph_runner"))
    assert "capture_bs" in _attrs(runner["DecodeCudaGraphRunner"])
    ew = top_level(parse(sglang_src, "sglang.srt.speculative.eagle_worker_v2"))
    assert "draft_runner" in _attrs(ew["EagleDraftWorker"])
    base = top_level(parse(sglang_src, "sglang.srt.speculative.base_spec_worker"))
    assert [ast.unparse(b) for b in ew["EAGLEWorkerV2"].bases] == ["BaseSpecWorker"]
    assert "draft_worker" in methods(base["BaseSpecWorker"])          # a property there
    ist = top_level(parse(sglang_src, "sglang.srt.managers.scheduler_components.internal_state"))
    fn = methods(ist["SchedulerInternalStateController"])["get_internal_state"]
    assert [a.arg for a in fn.args.args][:2] == ["self", "recv_req"]
    assert "GetInternalStateReqOutput(internal_state=" in ast.unparse(fn)
