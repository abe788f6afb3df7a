"""Batch-1 decode without speculation on the 8B-shaped preset, side by side in one run: the HBM
roofline (weight + KV bytes per token over the copy bandwidth measured here), the reference
engine (spawned rank over EngineClient, no draft model: the `--speculative-algorithm NONE`
server; one row per variant: CUDA graphs alone, + torch.compile, ...), a gpt-fast-style compiled
decoder of the same weights (benchmarks/compiled_baseline.py) and Hugging Face transformers'
`generate` (random weights, greedy, dynamic cache).

Before timing, a float32 check: the engine (its first variant) and the compiled baseline decode
the same prompt and must agree on the first `--check-tokens` greedy tokens.

GPU (one H200; about 6 minutes):
    python benchmarks/decode_roofline.py --out roofline.json
CPU check of the script (tiny shapes; the roofline then uses the CPU copy bandwidth):
    python benchmarks/decode_roofline.py --device cpu --model-path tiny --tokens 32 --skip-hf \
        --engine-variants graphs --baseline-compile off

Goals (issue "The engine at production speed on the H200"): engine >= 80 % of the roofline and
>= 1.15x the compiled baseline. Must not assert on timings: it prints measured ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

import torch  # noqa: E402

from refengine.presets import TARGETS  # noqa: E402


def copy_bandwidth(device: str, gib: float = 2.0, reps: int = 20) -> float:
    """Bytes read + written per second of a device-to-device copy (median of `reps`)."""
    n = int(gib * 2**30) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(reps + 2):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            b.copy_(a)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            b.copy_(a)
            times.append(time.perf_counter() - t0)
    del a, b
    return 2 * n * 2 / statistics.median(times[2:])


def bytes_per_token(cfg, ctx_mean: float, elt: int = 2) -> tuple[float, float]:
    """(weight bytes read per decode token, mean KV bytes read per token) for a Llama config:
    every matrix once, the embedding table only one row; K and V of every earlier position."""
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kvd = cfg.num_key_value_heads * cfg.head_dim
    qd = cfg.num_attention_heads * cfg.head_dim
    per_layer = h * qd + 2 * h * kvd + qd * h + 3 * h * i + 2 * h
    weights = layers * per_layer + h + cfg.vocab_size * h + h    # + final norm, lm_head, 1 embed row
    kv = 2 * layers * kvd * ctx_mean
    return weights * elt, kv * elt


# Engine variants: name -> EngineOptions fields on top of graphs on, TP1, no draft.
VARIANTS = {
    "graphs": {},
    "compile": {"enable_torch_compile": True},                 # the serve default: autotune on CUDA
    "inductor-default": {"enable_torch_compile": True, "torch_compile_mode": "default"},
    "autotune": {"enable_torch_compile": True, "torch_compile_mode": "max-autotune-no-cudagraphs"},
    "eager": {"cuda_graph": "off"},
    # The same without the overlap scheduler: each iteration read before the next is launched.
    "graphs-sync": {"disable_overlap_schedule": True},
    "compile-sync": {"enable_torch_compile": True, "disable_overlap_schedule": True},
}


def engine_options(a, prompt: list[int], variant: str, dtype: str):
    from refengine.client import EngineOptions

    base = dict(model_path=a.model_path, load_format="dummy", dtype=dtype, tp_size=1, device=a.device,
                speculative_algorithm="NONE", speculative_num_steps=0, context_length=max(1024, len(prompt) + a.tokens + 16),
                max_running_requests=1, cuda_graph=a.cuda_graph_mode, cuda_graph_timing=True, init_timeout_s=900)
    return EngineOptions(**{**base, **VARIANTS[variant]})


def engine_tokens(opts, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of one request through a fresh engine (the float32 check)."""
    from refengine.client import EngineClient, GenRequest

    client = EngineClient.start(opts)
    try:
        got: list[int] = []
        done = threading.Event()

        def on(u):
            got.extend(u.token_ids)
            if u.finished:
                done.set()
        client.submit(GenRequest("check", prompt, max_new_tokens=n, ignore_eos=True), on)
        if not done.wait(900):
            raise RuntimeError("engine generation timed out")
        return got
    finally:
        client.close()


def run_engine(a, prompt: list[int], variant: str = "graphs") -> dict:
    from refengine.client import EngineClient, GenRequest

    opts = engine_options(a, prompt, variant, a.dtype)
    t0 = time.time()
    client = EngineClient.start(opts)
    print(f"  engine ({variant}) ready in {time.time() - t0:.0f} s")
    try:
        def one(rid: str) -> float:
            done = threading.Event()
            t = time.perf_counter()
            client.submit(GenRequest(rid, prompt, max_new_tokens=a.tokens, ignore_eos=True),
                          lambda u: done.set() if u.finished else None)
            if not done.wait(900):
                raise RuntimeError("engine generation timed out")
            return time.perf_counter() - t

        t0 = time.time()
        one("warm")                           # captures the graphs of every context bucket met
        print(f"  engine ({variant}) warm-up request (compiles and captures) took {time.time() - t0:.0f} s")
        compiled_before = _compiled_graphs(client)
        runs = []
        for r in range(a.repeats):
            after, _ = client.phase_records(0, 1 << 20)   # the newest seq so far
            wall = one(f"r{r}")
            _, recs = client.phase_records(after, 4096)
            recs = [x for x in recs if not x.get("capture")]
            decode_s = sum(x["wall_ms"] for x in recs) / 1e3
            runs.append({"e2e_tok_s": a.tokens / wall, "decode_tok_s": sum(x["committed"] for x in recs) / decode_s,
                         "iteration_ms_median": statistics.median(x["wall_ms"] for x in recs),
                         "graph_mode": recs[-1]["graph_mode"] if recs else None})
        replay = [k for k in _graph_stats(client).get("keys", []) if k["phase"] == "verify" and k["replay_ms_mean"]]
        compiled_after = _compiled_graphs(client)
        return {"variant": variant, "runs": runs, "e2e_tok_s": statistics.median(r["e2e_tok_s"] for r in runs),
                "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
                "iteration_ms_median": statistics.median(r["iteration_ms_median"] for r in runs),
                "graph_mode": runs[-1]["graph_mode"],
                # GPU time of the forward alone (CUDA events around each replay), per context bucket.
                "verify_replay_ms": {str(k["shape"][1]): k["replay_ms_mean"] for k in replay},
                "compiled_graphs_after_warmup": compiled_before, "recompiles_while_timed":
                    (compiled_after - compiled_before) if compiled_before is not None else None}
    finally:
        client.close()


def _graph_stats(client) -> dict:
    # Ranks send their stats every 0.25 s: wait for a report newer than the last request.
    time.sleep(0.6)
    return client.stats()["per_rank"].get(0, {}).get("graphs", {})


def _compiled_graphs(client) -> int | None:
    return _graph_stats(client).get("compiled_graphs")


def run_baseline(a, prompt: list[int], dtype: str, n: int, repeats: int, compile: bool) -> dict:
    """The gpt-fast-style decoder over the same preset weights: (tokens, decode tok/s per run)."""
    from compiled_baseline import Decoder, Generator

    from refengine.presets import build_target

    t0 = time.time()
    target = build_target(a.model_path, 0, a.device)
    model = Decoder(target, max_seq=len(prompt) + n + 8, dtype=getattr(torch, dtype), device=a.device)
    del target
    gen = Generator(model, compile=compile)
    toks, _ = gen.generate(prompt, n)         # compiles (reduce-overhead: also captures its graphs)
    print(f"  compiled baseline ({dtype}, compile={compile}) built and warmed in {time.time() - t0:.0f} s")
    rates = []
    for _ in range(repeats):
        again, secs = gen.generate(prompt, n)
        assert again == toks, "the baseline is not deterministic"
        rates.append((n - 1) / secs)
    del gen, model
    torch._dynamo.reset()
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return {"tokens": toks, "runs": rates, "tok_s": statistics.median(rates) if rates else None}


def run_hf(a, prompt: list[int]) -> dict:
    import transformers
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM as HFLlama

    c = TARGETS[a.model_path]
    hf_cfg = HFConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                      num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                      rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings)
    dtype = getattr(torch, a.dtype)
    t0 = time.time()
    with torch.device(a.device):
        torch.manual_seed(0)
        model = HFLlama(hf_cfg).to(dtype).eval()
    print(f"  transformers {transformers.__version__} model built in {time.time() - t0:.0f} s")
    ids = torch.tensor([prompt], device=a.device)
    kw = dict(do_sample=False, max_new_tokens=a.tokens, min_new_tokens=a.tokens, pad_token_id=0)
    rates = []
    with torch.no_grad():
        model.generate(ids, **{**kw, "max_new_tokens": 16, "min_new_tokens": 16})
        for _ in range(a.repeats):
            if a.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            if a.device == "cuda":
                torch.cuda.synchronize()
            rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
    del model
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return {"version": transformers.__version__, "tok_s": statistics.median(rates), "runs": rates}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model-path", default="llama-3.1-8b", help="a target preset")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cuda-graph-mode", default="auto")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--engine-variants", default="compile,graphs",
                    help=f"comma list of {', '.join(VARIANTS)}; the first is the headline engine")
    ap.add_argument("--baseline-compile", default="on", choices=("on", "off"))
    ap.add_argument("--check-tokens", type=int, default=32, help="float32 agreement check length (0 = skip)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    cfg = TARGETS[a.model_path]
    report: dict = {"argv": sys.argv[1:], "model": a.model_path, "dtype": a.dtype, "tokens": a.tokens}
    if a.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
        print(f"# decode_roofline on {report['gpu']}; torch {torch.__version__}")
    prompt = [(7 * i + 3) % min(cfg.vocab_size, 30000) for i in range(a.prompt_len)]
    bw = copy_bandwidth(a.device, gib=2.0 if a.device == "cuda" else 0.25)
    elt = torch.finfo(getattr(torch, a.dtype)).bits // 8
    w, kv = bytes_per_token(cfg, a.prompt_len + a.tokens / 2, elt)
    roof = bw / (w + kv)
    report.update(bandwidth_GBps=bw / 1e9, weight_bytes=w, kv_bytes_mean=kv, roofline_tok_s=roof)
    print(f"  copy bandwidth {bw / 1e9:.0f} GB/s (read + written); bytes per token: weights {w / 1e9:.2f} GB, "
          f"KV {kv / 1e6:.1f} MB (mean context) -> roofline {roof:.1f} tok/s")
    variants = a.engine_variants.split(",")
    if a.check_tokens:
        fp32 = engine_options(a, prompt, variants[0], "float32")
        mine = engine_tokens(fp32, prompt, a.check_tokens)
        theirs = run_baseline(a, prompt, "float32", a.check_tokens, 0, a.baseline_compile == "on")["tokens"]
        same = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
        report["float32_check"] = {"tokens": a.check_tokens, "engine": mine, "baseline": theirs,
                                   "agree": mine == theirs, "first_difference": None if mine == theirs else same}
        print(f"  float32 check, first {a.check_tokens} greedy tokens: engine ({variants[0]}) vs compiled baseline "
              + ("agree" if mine == theirs else f"DIFFER from token {same}"))
    base = run_baseline(a, prompt, a.dtype, a.tokens, a.repeats, a.baseline_compile == "on")
    report["compiled_baseline"] = base
    report["engines"] = [run_engine(a, prompt, v) for v in variants]
    eng = report["engine"] = report["engines"][0]
    if not a.skip_hf:
        report["hf"] = run_hf(a, prompt)
    print(f"\n## batch-1 decode, {a.model_path} {a.dtype}, {a.tokens} new tokens after {a.prompt_len} "
          f"(median of {a.repeats}; goals: engine >= 80 % of roofline, >= 1.15x the compiled baseline)")
    print("   what                                          tok/s    / roofline")
    rows = [("HBM roofline", roof)]
    for e in report["engines"]:
        rows += [(f"engine {e['variant']}, decode iterations ({e['graph_mode']})", e["decode_tok_s"]),
                 (f"engine {e['variant']}, end to end (prefill incl.)", e["e2e_tok_s"])]
    rows.append(("gpt-fast-style compiled baseline, decode", base["tok_s"]))
    if "hf" in report:
        rows.append((f"transformers {report['hf']['version']} generate", report["hf"]["tok_s"]))
    for label, v in rows:
        print(f"   {label:<45} {v:8.1f}   {v / roof:6.1%}")
    for e in report["engines"]:
        replay = ", ".join(f"ctx {c}: {ms * 1e3:.0f}" for c, ms in e["verify_replay_ms"].items())
        print(f"   engine {e['variant']}: iteration median {e['iteration_ms_median'] * 1e3:.0f} µs; forward replay "
              f"(µs) {replay or 'n/a'}; recompiles while timed: {e['recompiles_while_timed']}")
    print(f"   roofline {1e6 / roof:.0f} µs per token")
    if "hf" in report:
        print(f"   engine / transformers: {eng['e2e_tok_s'] / report['hf']['tok_s']:.1f}x")
    report["engine_over_roofline"] = eng["decode_tok_s"] / roof
    report["compiled_baseline_tok_s"] = base["tok_s"]
    report["engine_over_compiled"] = eng["decode_tok_s"] / base["tok_s"]
    print(f"   engine ({eng['variant']}) / roofline {report['engine_over_roofline']:.1%}; "
          f"engine / compiled baseline {report['engine_over_compiled']:.3f}x")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
