"""The SGLang plugin's phase timers on a real GPU: no host sync on the hot path, accuracy, overhead.

SGLang itself cannot be installed on the lent GPU machines, so this drives the plugin's hook
functions, applied by SGLang 0.5.23's own HookRegistry (from the wheel, `--sglang-target`), around
a stand-in EAGLE worker with SGLang's method names and call order that does real GPU work:
draft = a CUDA-graph replay of (steps-1) matmul chains, verify = an eager target matmul stack plus a
sampling tail, draft_extend = a smaller eager stack. Three measurements:

  sync      every timed iteration runs under torch.cuda.set_sync_debug_mode("error"): any
            synchronizing call on the hot path (ours or torch's) raises
  accuracy  each phase's mean ms from the plugin's records vs the same phase timed alone with
            CUDA events and a synchronize (the reference), side by side
  overhead  host time per iteration: no hooks / hooks without a lease / hooks with a lease

Usage: python benchmarks/sglang_plugin_gpu.py [--iterations 300] [--out DIR]
Prints the table and writes records.jsonl + summary.json under --out. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import torch  # noqa: E402

from probes.inserver import sglang_plugin as P  # noqa: E402
from probes.inserver.sglang_stream import read_records  # noqa: E402

EW = "sglang.srt.speculative.eagle_worker_v2"
TPW = "sglang.srt.managers.tp_worker"


def build_modules(dev: str, hidden: int, steps: int):
    torch.manual_seed(0)
    ew, tpw = types.ModuleType(EW), types.ModuleType(TPW)

    class TpModelWorker:
        def __init__(self):
            self.ws = [torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) / hidden ** 0.5
                       for _ in range(8)]

        def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kw):
            x = (forward_batch if forward_batch is not None else batch).x.repeat(steps + 1, 1)
            for w in self.ws:
                x = torch.relu(x @ w)
            return x

    class EagleDraftWorker:
        def __init__(self):
            self.w = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) / hidden ** 0.5
            self.static_in = None
            self.graph = None

        def _chain(self, x):
            for _ in range(max(steps - 1, 1) * 3):
                x = torch.tanh(x @ self.w)
            return x

        def capture(self, x):
            self.static_in = x.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self._chain(self.static_in)              # warm-up outside capture
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = self._chain(self.static_in)

        def draft(self, batch):
            self.static_in.copy_(batch.x)
            self.graph.replay()
            return self.static_out

        def _draft_extend_for_decode(self, batch, batch_output, kv_loc_plan=None):
            x = batch.x.repeat(steps + 1, 1)
            for _ in range(2):
                x = torch.tanh(x @ self.w)
            return x

    class EAGLEWorkerV2:
        topk, speculative_num_steps, speculative_num_draft_tokens, device = 1, steps, steps + 1, dev
        adaptive_controller = None

        def __init__(self):
            self.draft_worker, self.target_worker = EagleDraftWorker(), TpModelWorker()

        def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                return None
            vi = self.draft_worker.draft(batch)
            out = self.verify(batch)
            self.draft_worker._draft_extend_for_decode(batch, out, kv_loc_plan=vi)
            return out

        def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
            logits = self.target_worker.forward_batch_generation(batch=None, forward_batch=batch,
                                                                 is_verify=True)
            probs = torch.softmax(logits.float(), -1)
            return probs.argmax(-1).view(steps + 1, -1).cumprod(0)   # acceptance-like tail

        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
            return None

    ew.EAGLEWorkerV2, ew.EagleDraftWorker, tpw.TpModelWorker = EAGLEWorkerV2, EagleDraftWorker, TpModelWorker
    for parent in ("sglang.srt.speculative", "sglang.srt.managers"):   # only the hooked modules travel
        if parent not in sys.modules:
            mod = types.ModuleType(parent)
            mod.__path__ = []
            sys.modules[parent] = mod
    sys.modules[EW], sys.modules[TPW] = ew, tpw
    return ew, tpw


class Mode:
    def is_extend(self):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sglang-target", type=Path, default=ROOT / ".cache" / "sglang-0.5.23-target")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = "cuda"
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="sglang-plugin-gpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stream_dir = Path(tempfile.mkdtemp(prefix="stream-"))
    os.environ["SPECDECODE_STREAM_DIR"] = str(stream_dir)

    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(args.sglang_target / "sglang")]
    sys.modules["sglang"] = pkg
    from sglang.srt.plugins.hook_registry import HookRegistry

    ew, _ = build_modules(dev, args.hidden, args.steps)
    worker = ew.EAGLEWorkerV2()
    batch = types.SimpleNamespace(forward_mode=Mode(), is_extend_in_batch=False,
                                  seq_lens=torch.zeros(args.bs, device=dev),
                                  x=torch.randn(args.bs, args.hidden, device=dev, dtype=torch.bfloat16))
    worker.draft_worker.capture(batch.x)
    acc = [2] * args.bs

    def run_n(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            worker.forward_batch_generation(batch)
            worker.on_verify_complete_cpu(acc, batch_size=args.bs)
        return (time.perf_counter() - t0) / n * 1e6

    def loop(n: int) -> float:
        torch.cuda.synchronize()
        host = run_n(n)
        torch.cuda.synchronize()
        return host

    # Reference: each phase alone, CUDA events + synchronize (unhooked).
    def phase_ref(fn, n=50):
        ts = []
        for _ in range(n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    loop(30)
    ref = {
        "draft": phase_ref(lambda: worker.draft_worker.draft(batch)),
        "target_verify": phase_ref(lambda: worker.target_worker.forward_batch_generation(
            forward_batch=batch, is_verify=True)),
        "verify_all": phase_ref(lambda: worker.verify(batch)),
        "draft_extend": phase_ref(lambda: worker.draft_worker._draft_extend_for_decode(batch, None)),
        "iteration": phase_ref(lambda: worker.forward_batch_generation(batch)),
    }
    bare_us = loop(args.iterations)

    HookRegistry.reset()
    P._probe = P._Probe()
    from sglang.srt.plugins.hook_registry import HookType
    for name in ("iteration", "draft", "verify", "target_forward", "draft_extend", "accepted"):
        HookRegistry.register(P.TARGETS[name], P.HOOKS[name], HookType.AROUND)
    HookRegistry.apply_hooks()
    assert all(P.TARGETS[n] in HookRegistry._patched for n in ("iteration", "draft", "verify"))
    off_us = loop(args.iterations)

    P._probe.lease.grant(3600, time.monotonic())
    loop(20)                                      # lazy set-up (events, stream file)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")       # any synchronizing call raises from here
    try:
        on_us = run_n(args.iterations)
        sync_ok = True
        sync_err = ""
    except RuntimeError as e:
        sync_ok, sync_err = False, str(e).splitlines()[0]
        on_us = float("nan")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    worker.forward_batch_generation(batch)       # resolve the tail
    for _ in range(6):
        worker.on_verify_complete_cpu(acc, batch_size=args.bs)
        worker.forward_batch_generation(batch)
    torch.cuda.synchronize()
    P._probe.flush()
    recs = read_records(stream_dir, limit=4096)["records"]
    recs = recs[20:]                              # drop warm-up
    med = lambda k: statistics.median(r["phase_ms"][k] for r in recs)  # noqa: E731
    plugin = {"draft": med("draft"), "verify": med("verify"), "verify_sample": med("verify_sample"),
              "draft_extend": med("draft_extend"), "other": med("other"),
              "wall": statistics.median(r["wall_ms"] for r in recs)}
    rows = [("draft", plugin["draft"], ref["draft"]),
            ("verify (target fwd)", plugin["verify"], ref["target_verify"]),
            ("verify_sample", plugin["verify_sample"], ref["verify_all"] - ref["target_verify"]),
            ("draft_extend", plugin["draft_extend"], ref["draft_extend"]),
            ("iteration wall", plugin["wall"], ref["iteration"])]
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  bs={args.bs} "
          f"hidden={args.hidden} steps={args.steps}  records={len(recs)}")
    print(f"no synchronizing call with timers on (set_sync_debug_mode=error): {sync_ok} {sync_err}")
    print(f"{'phase':<22}{'plugin ms':>10}{'alone ms':>10}{'ratio':>8}")
    for name, a, b in rows:
        print(f"{name:<22}{a:10.3f}{b:10.3f}{a / b if b else float('nan'):8.3f}")
    print(f"host us/iteration: bare {bare_us:.1f}  hooks off {off_us:.1f}  hooks on {on_us:.1f}")
    (out_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:200]))
    (out_dir / "summary.json").write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "bs": args.bs,
        "hidden": args.hidden, "steps": args.steps, "records": len(recs), "sync_ok": sync_ok,
        "sync_error": sync_err, "plugin_ms": plugin, "alone_ms": ref,
        "host_us": {"bare": bare_us, "off": off_us, "on": on_us}}, indent=1))
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
