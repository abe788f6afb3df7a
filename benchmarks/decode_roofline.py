"""Batch-1 decode without speculation on the 8B-shaped preset, side by side in one run: the HBM
roofline (weight + KV bytes per token over the copy bandwidth measured here), the reference
engine (CUDA graphs, bf16, TP1, spawned rank over EngineClient) and Hugging Face transformers'
`generate` on the same shapes (random weights, greedy, dynamic cache).

GPU (one H200; about 3 minutes):
    python benchmarks/decode_roofline.py --out roofline.json
CPU check of the script (tiny shapes; the roofline then uses the CPU copy bandwidth):
    python benchmarks/decode_roofline.py --device cpu --model-path tiny --tokens 32 --skip-hf

Goal (issue "Performance benchmarks on the H200s", item 1): the engine at >= 70 % of the roofline.
Must not assert on timings: it prints measured ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def run_engine(a, prompt: list[int]) -> dict:
    from refengine.client import EngineClient, EngineOptions, GenRequest

    opts = EngineOptions(model_path=a.model_path, load_format="dummy", dtype=a.dtype, tp_size=1, device=a.device,
                         speculative_algorithm="NONE", speculative_num_steps=0, context_length=max(1024, len(prompt) + a.tokens + 16),
                         max_running_requests=1, cuda_graph=a.cuda_graph_mode, init_timeout_s=600)
    t0 = time.time()
    client = EngineClient.start(opts)
    print(f"  engine ready in {time.time() - t0:.0f} s")
    try:
        def one(rid: str) -> float:
            done = threading.Event()
            t = time.perf_counter()
            client.submit(GenRequest(rid, prompt, max_new_tokens=a.tokens, ignore_eos=True),
                          lambda u: done.set() if u.finished else None)
            if not done.wait(900):
                raise RuntimeError("engine generation timed out")
            return time.perf_counter() - t

        one("warm")                           # captures the graphs of every context bucket met
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
        return {"runs": runs, "e2e_tok_s": statistics.median(r["e2e_tok_s"] for r in runs),
                "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
                "iteration_ms_median": statistics.median(r["iteration_ms_median"] for r in runs),
                "graph_mode": runs[-1]["graph_mode"]}
    finally:
        client.close()


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
    eng = run_engine(a, prompt)
    report["engine"] = eng
    if not a.skip_hf:
        report["hf"] = run_hf(a, prompt)
    print(f"\n## batch-1 decode, {a.model_path} {a.dtype}, {a.tokens} new tokens after {a.prompt_len} "
          f"(median of {a.repeats}; goal: engine >= 70 % of roofline)")
    print("   what                               tok/s    / roofline")
    rows = [("HBM roofline", roof), (f"engine, decode iterations ({eng['graph_mode']})", eng["decode_tok_s"]),
            ("engine, end to end (prefill incl.)", eng["e2e_tok_s"])]
    if "hf" in report:
        rows.append((f"transformers {report['hf']['version']} generate", report["hf"]["tok_s"]))
    for label, v in rows:
        print(f"   {label:<34} {v:8.1f}   {v / roof:6.1%}")
    if "hf" in report:
        print(f"   engine / transformers: {eng['e2e_tok_s'] / report['hf']['tok_s']:.1f}x")
    print(f"   engine iteration median {eng['iteration_ms_median'] * 1e3:.0f} µs vs roofline "
          f"{1e6 / roof:.0f} µs per token")
    report["engine_over_roofline"] = eng["decode_tok_s"] / roof
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
