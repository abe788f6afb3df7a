"""What a verify costs at a server's batch size: the engine next to a batched forward of the same
weights, per draft-token count, in one run.

Why it matters: a per-batch schedule pays where the best chain at high load is far shallower than
at batch 1, and that depends on how the target's forward grows with batch × tokens per row. On one
H200 the schedule A/B (results/schedule_ab_h200.md) found steps 4 best at load 1 and steps 3 at
load 64, so no schedule could gain more than 4 % there. If the engine's batch-64 forward carried a
fixed cost that a fast forward does not, deep chains would look cheaper at high load than on a
production engine and that ceiling would be the engine's, not the H200's. This script says which.

Engine: one EngineClient (TP1, CUDA graphs with replay timing, acceptance simulated on the
published 8B curve), `--batch` requests of `--ctx` prompt tokens and `--tokens` new tokens each,
one round per chain setting in `--steps`, applied live (a first round per setting captures its
graphs and is not counted). Per setting, from the iterations that ran the whole batch: the
iteration wall, committed tokens per iteration, tok/s, and the GPU time of each graph replay
(verify of T = steps + 1 tokens per row, draft step, draft extend; CUDA events, the engine's own).
Anchor: benchmarks/compiled_baseline.py's gpt-fast-style decoder with `--batch` rows, a forward of
T tokens per row over the same mean context, as one CUDA graph of its eager kernels (cuBLAS GEMMs,
SDPA) and, for the T in `--compile-t`, under torch.compile(mode="reduce-overhead") as gpt-fast does.
Second anchor, the practical floor of any engine built on cuBLAS: the same weights' matmuls alone
(every projection of every layer and the lm_head on `--batch` × T rows, attention and elementwise
ops left out; attention_variants.matmul_floor) replayed as one CUDA graph. The engine's excess over
it is its per-layer small kernels and attention: a fixed cost there makes deep chains look cheaper
at high load than they are on an engine with fused kernels.
Floors per T: weight + KV bytes over the copy bandwidth measured here, and 2 · params · rows · T
FLOPs over `--peak-tflops` (a spec-sheet figure; only a scale).

GPU (one H200; about 3 minutes, 1.5 without the compiled anchor, `--compile-t ""`):
    python benchmarks/batch_cost.py --json OUT.json
The engine compiled (serve --enable-torch-compile up to the batch; Inductor's default mode compiles
each verify shape in about half a minute), the anchors left out:
    python benchmarks/batch_cost.py --engine-compile default --skip-anchor --steps 0,1,2,3,4 --json OUT.json
CPU check of the script (tiny shapes, no graphs):
    python benchmarks/batch_cost.py --device cpu --model-path tiny-agreeing --batch 4 --ctx 32 \
        --tokens 16 --steps 0,2 --t 1,3 --compile-t ""

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import torch  # noqa: E402

import folded  # noqa: E402
from attention_variants import matmul_floor  # noqa: E402
from cuda_timing import graph_us  # noqa: E402
from decode_roofline import bytes_per_token, copy_bandwidth  # noqa: E402
from engine_runs import published_curve  # noqa: E402
from refengine.presets import TARGETS  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# -- the engine -------------------------------------------------------------------------------------
def _graph_keys(client) -> dict[str, dict]:
    """Rank 0's graph keys (replays, mean replay ms), once its stats cover every iteration so far."""
    for _ in range(100):
        s = client.stats()
        r0 = s["per_rank"].get(0, {})
        if r0.get("iterations", -1) >= s["iterations_total"]:
            return {k["key"]: k for k in r0.get("graphs", {}).get("keys", [])}
        time.sleep(0.05)
    raise RuntimeError("rank 0's statistics did not catch up with its iterations")


def _replay_delta(before: dict, after: dict, rows: int) -> dict[str, dict]:
    """Per graph key at `rows`: replays in the round and their mean GPU ms (CUDA events)."""
    out = {}
    for label, k in after.items():
        if k["rows"] != rows or k["replay_ms_mean"] is None:
            continue
        b = before.get(label)
        n0, m0 = (b["replays"], b["replay_ms_mean"] or 0.0) if b else (0, 0.0)
        n = k["replays"] - n0
        if n > 0:
            out[label] = {"phase": k["phase"], "shape": k["shape"], "replays": n,
                          "ms": (k["replay_ms_mean"] * k["replays"] - m0 * n0) / n}
    return out


def _round(client, a, tag: str, vocab: int) -> list[dict]:
    """`a.batch` requests at once, each `a.ctx` prompt tokens and `a.tokens` new ones; the records
    of the iterations they ran."""
    from refengine.client import GenRequest

    after, _ = client.phase_records(0, 1 << 30)
    left, lock, done = [a.batch], threading.Lock(), threading.Event()

    def on(u) -> None:
        if u.finished:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()
    for r in range(a.batch):
        prompt = [(7 * i + 131 * r + 3) % (vocab - 1) + 1 for i in range(a.ctx)]
        client.submit(GenRequest(f"{tag}-{r}", prompt, max_new_tokens=a.tokens, ignore_eos=True), on)
    if not done.wait(900):
        raise RuntimeError(f"round {tag}: {left[0]} of {a.batch} requests did not finish in 900 s")
    _, recs = client.phase_records(after, 1 << 30)
    return recs


def run_engine(a, rows_out: list[dict]) -> list[dict]:
    """One row per chain setting, appended to `rows_out` as each is measured (a call cut short keeps
    the settings it finished)."""
    from refengine.client import EngineClient, EngineOptions

    curve = ",".join(str(x) for x in published_curve())
    opts = EngineOptions(model_path=a.model_path, load_format="dummy", dtype=a.dtype, tp_size=1, device=a.device,
                         speculative_num_steps=a.steps[0], speculative_simulate_accept=curve,
                         max_running_requests=a.batch, context_length=a.ctx + a.tokens + 64,
                         cuda_graph_timing=True, cuda_graph_max_graphs=512, cuda_graph_log=False,
                         init_timeout_s=900, enable_torch_compile=a.engine_compile is not None,
                         torch_compile_max_bs=a.batch, torch_compile_mode=a.engine_compile or "auto")
    t0 = time.time()
    client = EngineClient.start(opts)
    print(f"  engine ready in {time.time() - t0:.0f} s (graph mode {client.graph_info()[0].get('mode')})", flush=True)
    vocab = client.model_info().get("vocab_size", TARGETS[a.model_path].vocab_size)
    try:
        for s in a.steps:
            client.set_config({"speculative_num_steps": s})
            t0 = time.time()
            _round(client, a, f"warm{s}", vocab)                   # captures this setting's graphs
            warm_s = time.time() - t0
            before = _graph_keys(client)
            recs = _round(client, a, f"s{s}", vocab)
            replays = _replay_delta(before, _graph_keys(client), a.batch)
            # The whole batch, nothing captured, no prefill riding along (the last admissions).
            full = [r for r in recs if r["bs"] == a.batch and not r.get("capture") and r["steps"] == s
                    and not r["phase_ms"].get("prefill")]
            if not full:
                raise RuntimeError(f"steps {s}: no iteration ran the whole batch of {a.batch}")
            wall = [r["wall_ms"] for r in full]
            committed = sum(r["committed"] for r in full)
            verify = {v["shape"][0]: v["ms"] for v in replays.values() if v["phase"] == "verify"}
            gpu = {p: sum(v["ms"] * v["replays"] for v in replays.values() if v["phase"] == p) / len(full)
                   for p in ("verify", "draft_step", "draft_extend")}
            row = {"steps": s, "iterations": len(full), "iteration_ms_median": statistics.median(wall),
                   "iteration_ms_p10_p90": [_q(wall, 0.1), _q(wall, 0.9)],
                   "committed_per_iteration": committed / len(full), "tok_s": 1e3 * committed / sum(wall),
                   "verify_gpu_ms": verify.get(s + 1), "gpu_ms_per_iteration": gpu,
                   "phase_ms_median": {p: statistics.median(r["phase_ms"].get(p, 0.0) for r in full)
                                       for p in sorted({p for r in full for p in r["phase_ms"]})},
                   "graph_keys": replays, "warm_round_s": warm_s}
            rows_out.append(row)
            a.save()
            vg = row["verify_gpu_ms"]
            print(f"  steps {s}: {len(full)} full-batch iterations, {row['iteration_ms_median']:.2f} ms median wall, "
                  f"{row['committed_per_iteration'] / a.batch:.2f} tokens/row, {row['tok_s']:.0f} tok/s; verify GPU "
                  f"{'n/a' if vg is None else f'{vg:.2f} ms'}; warm round {warm_s:.0f} s", flush=True)
    finally:
        client.close()
    return rows_out


def _q(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


# -- the anchor -------------------------------------------------------------------------------------
def _time(fn, device: str, reps: int = 5, inner: int = 10) -> list[float]:
    """ms per call: `reps` medians-to-be of `inner` back-to-back calls (CUDA events on CUDA)."""
    out = []
    for _ in range(reps):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) / inner)
        else:
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t) * 1e3 / inner)
    return out


def run_anchor(a) -> list[dict]:
    from compiled_baseline import Decoder

    from refengine.presets import build_target

    ctx = a.ctx + a.tokens // 2                 # the engine rounds' mean context
    target = build_target(a.model_path, 0, a.device)
    model = Decoder(target, max_seq=ctx + max(a.t) + 1, dtype=getattr(torch, a.dtype), device=a.device,
                    batch=a.batch)
    del target
    vocab = model.embed.shape[0]
    out = []
    for t in a.t:
        idx = torch.randint(1, vocab, (a.batch, t), device=a.device)
        pos = torch.arange(ctx, ctx + t, device=a.device)

        def fwd(m=model):
            return m(idx, pos).argmax(-1)
        row = {"t": t}
        with torch.no_grad():
            if a.device == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        fwd()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fwd()
                row["graph_ms"] = statistics.median(_time(graph.replay, a.device))
                del graph
            else:
                row["eager_ms"] = statistics.median(_time(fwd, a.device, reps=3, inner=2))
            if t in a.compile_t:
                t0 = time.time()
                step = torch.compile(lambda: fwd(), mode="reduce-overhead", fullgraph=True)
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                    for _ in range(3):
                        step()
                    row["compile_s"] = time.time() - t0
                    row["compiled_ms"] = statistics.median(_time(step, a.device))
                torch._dynamo.reset()
        out.append(row)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "t")
        print(f"  anchor T={t}: {shown}", flush=True)
    del model
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return out


def run_matmuls(a, ts: list[int]) -> dict[int, float]:
    """ms of the matmuls alone (attention_variants.matmul_floor) on `a.batch` x T rows, per T."""
    from refengine.models.layers import fuse_projections
    from refengine.presets import build_target

    dtype = getattr(torch, a.dtype)
    model = fuse_projections(build_target(a.model_path, 0, a.device).to(dtype).eval())
    out = {}
    with torch.no_grad():
        for t in ts:
            x = torch.randn(a.batch, t, model.config.hidden_size, device=a.device, dtype=dtype)
            out[t] = graph_us(lambda: matmul_floor(model, x), 30 if a.device == "cuda" else 3, a.device) / 1e3
            print(f"  matmuls only T={t}: {out[t]:.2f} ms", flush=True)
    del model
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return out


# -- the table --------------------------------------------------------------------------------------
def floors(a, bw: float) -> dict[int, dict]:
    cfg = TARGETS[a.model_path]
    elt = torch.finfo(getattr(torch, a.dtype)).bits // 8
    w, kv = bytes_per_token(cfg, a.ctx + a.tokens / 2, elt)
    params = w / elt - cfg.hidden_size                     # every matrix once (the embedding row left out)
    out = {}
    for t in sorted(set(a.t) | {s + 1 for s in a.steps}):
        mem = (w + a.batch * kv) / bw * 1e3
        flop = 2 * params * a.batch * t / (a.peak_tflops * 1e12) * 1e3
        out[t] = {"memory_ms": mem, "compute_ms": flop, "floor_ms": max(mem, flop), "kv_ms": a.batch * kv / bw * 1e3}
    return out


def _floors_of(report: dict) -> dict[int, dict]:
    """The floors of a saved report, recomputed from its own parameters (older reports lack kv_ms)."""
    steps = [r["steps"] for r in report.get("engine", [])]
    ts = {int(t) for t in report.get("matmuls_ms", {})} | {r["t"] for r in report.get("anchor", [])}
    a = argparse.Namespace(model_path=report["model"], dtype=report["dtype"], ctx=report["ctx"],
                           tokens=report["tokens"], batch=report["batch"], t=sorted(ts), steps=steps,
                           peak_tflops=report.get("peak_tflops", 989.0))
    return floors(a, report["bandwidth_GBps"] * 1e9)


def _best_anchor(row: dict) -> float | None:
    return min((v for v in (row.get("graph_ms"), row.get("compiled_ms"), row.get("eager_ms")) if v), default=None)


def summarise(report: dict) -> dict:
    """Ratios per T, and what the engine's chain settings would do if its verify ran at the floor.

    The projection keeps everything the engine measured except the verify: an iteration becomes the
    matmuls alone of T tokens per row plus the KV pool's bytes at the copy bandwidth (attention's
    floor), plus the engine's own non-verify time (draft steps, extend, host: iteration wall minus
    verify GPU time). Same committed tokens per iteration. It is arithmetic on measured parts, not a
    measurement: what an engine with fused small kernels would see at most."""
    fl = _floors_of(report)
    mm = {int(t): v for t, v in report.get("matmuls_ms", {}).items()}
    anchor = {r["t"]: r for r in report.get("anchor", [])}
    out: dict = {"engine_over_matmuls": {}, "engine_over_anchor": {}, "projected_at_floor": {}}
    for e in report.get("engine", []):
        t, v = e["steps"] + 1, e.get("verify_gpu_ms")
        if not v:
            continue
        if t in mm:
            out["engine_over_matmuls"][t] = v / mm[t]
            it = mm[t] + fl[t]["kv_ms"] + (e["iteration_ms_median"] - v)
            out["projected_at_floor"][e["steps"]] = {
                "iteration_ms": it, "tok_s": 1e3 * e["committed_per_iteration"] / it}
        if t in anchor and _best_anchor(anchor[t]):
            out["engine_over_anchor"][t] = v / _best_anchor(anchor[t])
    eng = [e for e in report.get("engine", []) if e.get("tok_s")]
    if eng:
        out["best_steps_measured"] = max(eng, key=lambda e: e["tok_s"])["steps"]
    proj = out["projected_at_floor"]
    if proj:
        out["best_steps_at_floor"] = max(proj, key=lambda s: proj[s]["tok_s"])
    return out


def table_lines(report: dict) -> list[str]:
    """The printed table of a report (live or saved)."""
    fl, summ = _floors_of(report), summarise(report)
    mm = {int(t): v for t, v in report.get("matmuls_ms", {}).items()}
    anchor = {r["t"]: r for r in report.get("anchor", [])}
    eng = {r["steps"] + 1: r for r in report.get("engine", [])}
    proj = summ["projected_at_floor"]
    cell = lambda v, w=8: f"{v:{w}.2f}" if isinstance(v, (int, float)) else " " * (w - 3) + "n/a"  # noqa: E731
    whole = lambda v, w: f"{v:{w}.0f}" if isinstance(v, (int, float)) else " " * (w - 3) + "n/a"  # noqa: E731
    mode = f"compiled ({report['engine_compile']})" if report.get("engine_compile") else "CUDA graphs"
    lines = [f"## one forward of T tokens per row at batch {report['batch']} (ms; floors: "
             f"{report['bandwidth_GBps']:.0f} GB/s copy bandwidth, {report.get('peak_tflops', 989.0):g} TFLOP/s); "
             f"engine: {mode}",
             "    T   floor(mem/compute)  matmuls only  anchor graph*  anchor compiled   engine verify GPU  "
             "engine/matmuls  engine/anchor   engine iteration wall  tok/s   tok/s at floor**"]
    for t in sorted(set(anchor) | set(eng) | set(mm)):
        f, an, e = fl.get(t, {}), anchor.get(t, {}), eng.get(t, {})
        p = proj.get(t - 1, {})
        lines.append(
            f"  {t:3d}   {cell(f.get('memory_ms'), 6)} / {cell(f.get('compute_ms'), 6)}   {cell(mm.get(t), 11)}   "
            f"{cell(an.get('graph_ms', an.get('eager_ms')), 10)}   {cell(an.get('compiled_ms'), 13)}   "
            f"{cell(e.get('verify_gpu_ms'), 16)}   {cell(summ['engine_over_matmuls'].get(t), 13)}   "
            f"{cell(summ['engine_over_anchor'].get(t), 12)}   {cell(e.get('iteration_ms_median'), 20)}  "
            f"{whole(e.get('tok_s'), 6)}   {whole(p.get('tok_s'), 14)}")
    lines.append("  * a CUDA graph of the anchor's eager kernels; on CPU the eager forward. The engine's verify "
                 "is GPU time per replay (CUDA events); without graphs see phase_ms_median in the JSON.")
    lines.append("  ** the engine's committed tokens over (matmuls only + the KV pool at copy bandwidth + the "
                 "engine's non-verify time): a projection, not a measurement.")
    if "best_steps_measured" in summ:
        at_floor = (f"; at the floor steps {summ['best_steps_at_floor']}" if "best_steps_at_floor" in summ else "")
        lines.append(f"  best chain setting at batch {report['batch']}: steps {summ['best_steps_measured']} "
                     f"measured{at_floor}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model-path", default="llama-3.1-8b", help="a target preset")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=256, help="prompt tokens per request")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request and round")
    ap.add_argument("--steps", type=_ints, default=_ints("0,1,2,3,4,5,6,7"))
    ap.add_argument("--t", type=_ints, default=_ints("1,2,3,4,5,6,7,8"), help="anchor tokens per row")
    ap.add_argument("--compile-t", type=_ints, default=_ints("1,4"), help="anchor T also timed compiled")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 spec sheet)")
    ap.add_argument("--engine-compile", default=None, choices=("default", "max-autotune-no-cudagraphs"),
                    help="serve --enable-torch-compile in this Inductor mode, up to --batch rows")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-anchor", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--from-json", default=None, metavar="FILE[#RUN]",
                    help="print the table of a saved report (a run of a folded results file); run nothing")
    a = ap.parse_args(argv)
    if a.from_json:
        try:
            report = folded.read(a.from_json)
            print("\n".join(table_lines(report)))
        except (ValueError, KeyError, TypeError) as e:       # FoldedError is a ValueError
            print(f"batch_cost: --from-json {a.from_json}: not a batch_cost report ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        return 0
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    t_start = time.time()
    report: dict = {"argv": sys.argv[1:], "model": a.model_path, "dtype": a.dtype, "batch": a.batch,
                    "ctx": a.ctx, "tokens": a.tokens, "peak_tflops": a.peak_tflops}
    if a.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    print(f"# batch_cost: {a.model_path} {a.dtype} on {report.get('gpu', a.device)}, batch {a.batch}, "
          f"context {a.ctx} + {a.tokens} new; torch {torch.__version__}", flush=True)
    bw = copy_bandwidth(a.device, gib=2.0 if a.device == "cuda" else 0.25)
    report["bandwidth_GBps"] = bw / 1e9
    fl = report["floors"] = floors(a, bw)
    def save() -> None:                  # after each half, so a call cut short keeps what it measured
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1, default=str))
    a.save = save
    report["engine_compile"] = a.engine_compile
    report["engine"] = []
    if not a.skip_engine:
        run_engine(a, report["engine"])
    ts = sorted(set(a.t) | {s + 1 for s in a.steps})
    report["matmuls_ms"] = {} if a.skip_anchor else run_matmuls(a, ts)
    save()
    report["anchor"] = [] if a.skip_anchor else run_anchor(a)
    save()
    report.update(summarise(report))
    print("\n" + "\n".join(table_lines(report)))
    report["wall_s"] = time.time() - t_start
    print(f"# wall {report['wall_s']:.0f} s")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
