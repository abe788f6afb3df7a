"""GPU smoke test of the reference engine through a real `serve` over HTTP: every draft placement
generates, live switching works, speculative output equals no speculation (tie rules below), and
per-phase costs are printed next to the H200 cost proxy — with CUDA graphs and eagerly.

GPU, the H200 pair (planned for under 10 minutes; split with --parts if that is too long):
    python benchmarks/gpu_smoke.py --device cuda --tp-size 2 --out smoke.json
CPU check of the script (gloo ranks; the graph part uses the static stand-in of CUDA graphs):
    python benchmarks/gpu_smoke.py --device cpu --tp-size 2

Parts (each but `proxy` starts its own `serve`):
  cuda: proxy          no server: the weight-streaming matmuls of each phase's exact shapes (8B
                       target, its EAGLE-3 head, TP1) replayed in a CUDA graph: the floor each
                       measured phase is divided by (TP > 1 needs the collectives: the TP2 issue)
        compile-bf16   llama-3.1-8b shapes, random weights, bf16, graphs + --enable-torch-compile
                       (outputs reported; per-phase costs; no recompile after warm-up)
        compile-fp32   the same in float32                                      (outputs must match)
        graphs-bf16    llama-3.1-8b shapes, random weights, bf16, CUDA graphs  (outputs reported)
        eager-bf16     the same with --disable-cuda-graph                       (outputs reported)
        graphs-fp32    the same shapes in float32 with CUDA graphs              (outputs must match)
        agreeing-bf16  tiny-agreeing in bf16 with CUDA graphs + compile, real acceptance (must match)
  cpu:  static-fp32    tiny-agreeing, float32, --cuda-graph-mode static         (outputs must match)
        eager-fp32     tiny-agreeing, float32, eager                            (outputs must match)

Tie rules. Verify runs N tokens per forward where plain decoding runs one, so the matmul shapes and
hence the rounding differ. Random 8B weights give top-2 logit gaps of the order of 0.01-0.3, and bf16
rounds logits by about 2^-8 of their size, so a bf16 near-tie flips a greedy token every few dozen
tokens: for bf16 on the 8B shapes we print how many leading tokens equal plain decoding and do not
fail. Identity is required where ties are out of reach: float32 (rounding ~1e-6) and the
agreeing preset in bf16 (constructed logit margin 6).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

from cuda_timing import graph_us  # noqa: E402
from engine_runs import PROXY_US, base_env, describe_gpus, fmt  # noqa: E402
from tuner.engine_process import EngineProcess, EngineStartError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLACEMENTS = ("sharded", "replicated", "rank0")
CONFIGS = [("chain steps=1", {"speculative_num_steps": 1, "speculative_eagle_topk": 1}),
           ("chain steps=3", {"speculative_num_steps": 3, "speculative_eagle_topk": 1}),
           ("tree 3/4/8", {"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8})]
SWITCHES = [{"speculative_draft_placement": "replicated", "speculative_num_steps": 2},
            {"speculative_draft_placement": "rank0", "speculative_num_steps": 5},
            {"speculative_num_steps": 0},
            {"speculative_draft_placement": "sharded", "speculative_num_steps": 3},
            {"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8, "speculative_draft_placement": "replicated"}]


@dataclass(frozen=True)
class Part:
    name: str
    model: str
    dtype: str
    graph_mode: str          # --cuda-graph-mode
    strict: bool             # outputs must equal plain decoding
    compile: bool = False    # --enable-torch-compile


def parts_for(device: str, model: str | None) -> list[Part]:
    if device == "cuda":
        big = model or "llama-3.1-8b"
        return [Part("proxy", big, "bfloat16", "-", False),
                Part("compile-bf16", big, "bfloat16", "auto", False, True),
                Part("compile-fp32", big, "float32", "auto", True, True),
                Part("graphs-bf16", big, "bfloat16", "auto", False), Part("eager-bf16", big, "bfloat16", "off", False),
                Part("graphs-fp32", big, "float32", "auto", True),
                Part("agreeing-bf16", "tiny-agreeing", "bfloat16", "auto", True, True)]
    small = model or "tiny-agreeing"
    return [Part("static-fp32", small, "float32", "static", True), Part("eager-fp32", small, "float32", "off", True)]


def leading_equal(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_part(part: Part, a, report: dict) -> bool:
    import httpx

    if part.name == "proxy":
        return run_proxy(part, a, report)
    argv = ["--device", a.device, "--tp-size", str(a.tp_size), "--model-path", part.model, "--load-format", "dummy",
            "--dtype", part.dtype, "--port", "0", "--context-length", "2048", "--max-running-requests", "4",
            "--speculative-num-steps", "3", "--decode-log-interval", "20", "--cuda-graph-mode", part.graph_mode]
    if part.compile:
        argv.append("--enable-torch-compile")
    t0 = time.time()
    srv: EngineProcess | None = None
    out: dict = {"part": part.name, "model": part.model, "dtype": part.dtype, "graph_mode": part.graph_mode,
                 "strict": part.strict, "compile": part.compile}
    ok = True
    try:
        # Every rank counts its waits for the GPU per step (records' `syncs`, refengine.engine).
        srv = EngineProcess.start(argv, env={"PYTHONPATH": str(ROOT), "SPECDECODE_COUNT_SYNCS": "1", **base_env()},
                                  timeout_s=a.start_timeout_s,
                                  cwd=ROOT)
        url = srv.url
        print(f"\n## {part.name}: serve {' '.join(argv)}  (ready in {time.time() - t0:.0f} s)")
        http = httpx.Client(base_url=url, timeout=600)
        vocab = http.get("/model_info").json().get("vocab_size") or 128
        rng = random.Random(7)
        # Even ids: on the agreeing preset's token cycle, so its drafts get accepted (any ids do
        # for random weights).
        prompt = [2 * rng.randrange(1, min(vocab, 30000) // 2 - 1) for _ in range(12)]

        def gen(n: int) -> list[int]:
            r = http.post("/generate", json={"input_ids": prompt, "sampling_params": {
                "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
            r.raise_for_status()
            return r.json()["output_ids"]

        def state(**kw) -> None:
            r = http.post("/set_internal_state", json={"server_args": kw})
            if r.status_code != 200 or r.json() != [True]:
                raise RuntimeError(f"/set_internal_state {kw}: {r.status_code} {r.text}")

        n = a.tokens
        state(speculative_num_steps=0)
        ref = gen(n * 3)
        rows = []
        for placement in PLACEMENTS:
            for label, cfg in CONFIGS:
                state(**cfg, speculative_draft_placement=placement)
                got = gen(n)
                same = leading_equal(got, ref)
                good = same == n
                ok &= good or not part.strict
                rows.append({"placement": placement, "config": label, "leading_equal": same, "tokens": n})
                print(f"  {placement:<10} {label:<14} equal to plain: {same}/{n} tokens"
                      + ("" if good else ("  MISMATCH" if part.strict else "  (bf16 near-tie: reported, not failed)")))
                state(speculative_eagle_topk=1, speculative_num_steps=3)
        out["placements"] = rows
        # Live switching while one streamed request runs: the output must stay plain decoding's.
        state(speculative_num_steps=3, speculative_eagle_topk=1, speculative_draft_placement="sharded")
        live = _live_switching(http, prompt, n * 3, part)
        same = leading_equal(live["output_ids"], ref)
        ok &= same == n * 3 or not part.strict
        out["live_switching"] = {"leading_equal": same, "tokens": n * 3, "switches_applied": live["applied"],
                                 "epochs_seen": live["epochs"]}
        print(f"  live switching ({live['applied']} switches, epochs {live['epochs']}): equal to plain "
              f"{same}/{n * 3} tokens" + ("" if same == n * 3 else ("  MISMATCH" if part.strict else "  (reported)")))
        # Everything the costs run needs was compiled above: nothing may compile from here on.
        compiled = http.get("/server_info").json()["internal_states"][0].get("torch_compile_graphs")
        out["costs"] = _costs(http, prompt, a, state)
        info = http.get("/server_info").json()
        if part.compile:
            after = info["internal_states"][0].get("torch_compile_graphs")
            out["compiled_graphs"] = {"after_warmup": compiled, "after_costs": after}
            recompiled = after is None or compiled is None or after != compiled
            ok &= not recompiled
            print(f"  torch.compile graphs after warm-up {compiled}, after the cost runs {after}"
                  + ("  RECOMPILED after warm-up" if recompiled else " (no recompile)"))
        out["server_internal_state"] = info["internal_states"][0]
        lines = srv.log_text().splitlines()
        log = [line for line in lines if "Decode batch" in line]
        if log:
            print(f"  last decode log line: {log[-1]}")
            out["decode_log"] = log[-1]
        captures = [line for line in lines if "refengine: graph" in line]
        out["captures_logged"] = len(captures)
        # No silent fallbacks: a capture that failed (a graph break under fullgraph compile, an
        # uncapturable op) runs eagerly from then on and would still pass the identity checks.
        failed = [line for line in captures if "capture FAILED" in line]
        out["captures_failed"] = len(failed)
        if failed:
            ok = False
            print(f"  CAPTURE FAILED {len(failed)}x, e.g. {failed[0].split('refengine: ')[1]}")
        print(f"  graph captures logged by rank 0: {len(captures)}"
              + (f" (e.g. {captures[0].split('refengine: ')[1]})" if captures else ""))
        http.close()
    except Exception as e:  # one failed part is reported, the others still run
        ok = False
        out["error"] = f"{type(e).__name__}: {e}"
        tail = e.log_tail if isinstance(e, EngineStartError) else srv.log_tail(15) if srv else ""
        print(f"  ERROR: {out['error']}\n  server output (last lines):\n    "
              + "\n    ".join(tail.splitlines()[-15:]))
    finally:
        out["server_exit"] = srv.stop(timeout=60) if srv else None
    out["ok"] = ok
    report["parts"].append(out)
    return ok


def _live_switching(http, prompt: list[int], n: int, part: Part) -> dict:
    """Stream one request and apply SWITCHES one after another while it runs."""
    out = {"output_ids": [], "applied": 0, "epochs": []}
    progress = threading.Condition()

    def switcher():
        for i, sw in enumerate(SWITCHES):
            with progress:
                progress.wait_for(lambda: len(out["output_ids"]) >= (i + 1) * n // (len(SWITCHES) + 1), timeout=300)
            r = http.post("/set_internal_state", json={"server_args": sw})
            if r.status_code == 200 and r.json() == [True]:
                out["applied"] += 1
                out["epochs"].append(http.get("/server_info").json()["internal_states"][0]["config_epoch"])
    t = threading.Thread(target=switcher, daemon=True)
    t.start()
    with http.stream("POST", "/generate", json={"input_ids": prompt, "stream": True, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if "output_ids" in chunk:
                    with progress:
                        out["output_ids"] = chunk["output_ids"]
                        progress.notify_all()
    t.join(60)
    return out


def _costs(http, prompt: list[int], a, state) -> dict:
    """Batch 1, steps 3 (chain: 2 draft forwards, verify of 4 tokens) per placement: median
    phase ms over the iterations of that epoch that captured nothing."""
    res = {}
    print("  per-phase cost, batch 1, steps 3 (median over iterations without a capture):")
    for placement in PLACEMENTS:
        state(speculative_num_steps=3, speculative_eagle_topk=1, speculative_draft_placement=placement)
        epoch = http.get("/server_info").json()["internal_states"][0]["config_epoch"]
        after = http.get("/specdecode/phases", params={"after": 0, "limit": 1}).json()["next"]
        for _ in range(2):   # the first run captures what it needs; the second is measured
            http.post("/generate", json={"input_ids": prompt, "sampling_params": {
                "max_new_tokens": a.cost_tokens, "temperature": 0, "ignore_eos": True}}).raise_for_status()
        recs = []
        while True:
            body = http.get("/specdecode/phases", params={"after": after, "limit": 4096}).json()
            recs += body["records"]
            if not body["records"]:
                break
            after = body["next"]
        recs = [r for r in recs if r["epoch"] == epoch and not r.get("capture") and r["bs"] == 1 and r["steps"] == 3]
        if not recs:
            continue

        def med(key, p):
            vals = [r[key][p] for r in recs if p in r.get(key, {})]
            return statistics.median(vals) if vals else math.nan
        res[placement] = {"iterations": len(recs), "draft_step_us": med("phase_ms", "draft") / 2 * 1e3,
                          "verify4_us": med("phase_ms", "verify") * 1e3,
                          "draft_extend_us": med("phase_ms", "draft_extend") * 1e3,
                          "wall_us": statistics.median(r["wall_ms"] for r in recs) * 1e3,
                          "comm_us": {p: med("comm_ms", p) * 1e3 for p in ("draft", "verify", "draft_extend")},
                          "calls_in_graph": recs[-1].get("comm_calls_in_graph", {}),
                          "calls": recs[-1]["comm_calls"],
                          # Rank 0's waits for the GPU per iteration (None on CPU: not counted).
                          "syncs_max": max((r["syncs"] for r in recs if "syncs" in r), default=None),
                          "syncs_median": statistics.median(r["syncs"] for r in recs) if "syncs" in recs[0] else None,
                          "sync_calls": sorted({c for r in recs for c in r.get("sync_calls", [])})[:8],
                          "wall_over_phases": sum(r["wall_ms"] for r in recs) / max(1e-9, sum(
                              v for r in recs for k, v in r["phase_ms"].items() if k != "other"))}
        c = res[placement]
        print(f"    {placement:<10} iters {c['iterations']:>3}  draft step {c['draft_step_us']:8.1f} µs  verify(4) "
              f"{c['verify4_us']:8.1f} µs  extend {c['draft_extend_us']:8.1f} µs  wall {c['wall_us']:8.1f} µs  "
              f"comm µs draft/verify {fmt(c['comm_us']['draft'], '{:.1f}')}/{fmt(c['comm_us']['verify'], '{:.1f}')}"
              f"  collectives in graphs {c['calls_in_graph']}  syncs/iteration max {c['syncs_max']}"
              f"  wall/phases {c['wall_over_phases']:.3f}" + (f"  sync calls {c['sync_calls']}" if c["sync_calls"] else ""))
    return res


def phase_proxy_us(model: str, tokens: int, reps: int = 100) -> dict[str, float]:
    """The weight-streaming floor of each phase at TP1: the matmuls of the 8B target and its
    EAGLE-3 head at each phase's exact shapes, on random bf16 weights, replayed in one CUDA graph
    (median µs). No attention math, norms or elementwise ops: what a phase costs at least."""
    import torch

    from refengine.presets import HEADS, TARGETS

    t, h = TARGETS[model], HEADS[f"{model}-eagle3"]
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    w = lambda o, i: torch.randn(o, i, device=dev, dtype=dt, generator=g) * 0.02

    def layer_mats(hidden, inter, heads, kv, hd, in_dim):
        return [w((heads + 2 * kv) * hd, in_dim), w(hidden, heads * hd), w(2 * inter, hidden), w(hidden, inter)]
    target = [layer_mats(t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads,
                         t.head_dim, t.hidden_size) for _ in range(t.num_hidden_layers)]
    lm_head = w(t.vocab_size, t.hidden_size)
    mid = layer_mats(h.hidden_size, h.intermediate_size, h.num_attention_heads, h.num_key_value_heads, h.head_dim,
                     2 * h.hidden_size)
    fc, d_head = w(h.hidden_size, 3 * h.target_hidden_size), w(h.draft_vocab_size, h.hidden_size)

    def stream(mats, x_rows):
        for m in mats:
            torch.matmul(x_rows[m.shape[1]], m.t())

    def run_target(n):
        xs = {k: torch.zeros(n, k, device=dev, dtype=dt) for k in {m.shape[1] for lm in target for m in lm}}
        return lambda: ([stream(lm, xs) for lm in target], torch.matmul(xs[t.hidden_size], lm_head.t()))

    def run_head(n, with_fc):
        widths = {m.shape[1] for m in mid} | {h.hidden_size, 3 * h.target_hidden_size}
        xs = {k: torch.zeros(n, k, device=dev, dtype=dt) for k in widths}
        return lambda: ((torch.matmul(xs[fc.shape[1]], fc.t()) if with_fc else None), stream(mid, xs),
                        torch.matmul(xs[h.hidden_size], d_head.t()))

    out = {"decode": graph_us(run_target(1), reps), "verify4": graph_us(run_target(tokens), reps),
           "draft_step": graph_us(run_head(1, False), reps), "draft_extend4": graph_us(run_head(tokens, True), reps)}
    del target, lm_head, mid, fc, d_head
    torch.cuda.empty_cache()
    return out


def run_proxy(part: Part, a, report: dict) -> bool:
    if a.device != "cuda" or a.tp_size != 1:
        print(f"\n## proxy: SKIPPED (TP1 on CUDA only; TP {a.tp_size} on {a.device} needs the phase's collectives)")
        report["parts"].append({"part": "proxy", "skipped": True})
        return True
    print("\n## proxy: weight-streaming matmuls per phase, TP1, bf16, one CUDA graph each (median µs)")
    proxy = phase_proxy_us(part.model, 4)
    for k, v in proxy.items():
        print(f"    {k:<14} {v:9.1f}")
    report["parts"].append({"part": "proxy", "ok": True, "proxy_us": proxy})
    return True


def print_tp1_ratio_table(report: dict) -> None:
    """Measured phase ÷ the proxy measured in this run (TP1)."""
    proxy = next((p.get("proxy_us") for p in report["parts"] if p.get("part") == "proxy" and p.get("proxy_us")), None)
    if not proxy:
        return
    print("\n## per-phase cost ÷ weight-streaming proxy of this run (TP1, batch 1, steps 3; "
          "goals: verify(4) <= 1.15x, draft step <= 1.3x)")
    print("   part            phase            measured µs   proxy µs   measured/proxy")
    table = []
    for p in report["parts"]:
        c = p.get("costs", {}).get("sharded")
        if not c or p.get("dtype") != "bfloat16" or p.get("model") == "tiny-agreeing":
            continue
        for label, key, pk in (("verify of 4", "verify4_us", "verify4"), ("draft step", "draft_step_us", "draft_step"),
                               ("draft extend 4", "draft_extend_us", "draft_extend4")):
            ratio = c[key] / proxy[pk]
            table.append({"part": p["part"], "phase": label, "measured_us": c[key], "proxy_us": proxy[pk],
                          "ratio": ratio})
            print(f"   {p['part']:<15} {label:<16} {c[key]:11.1f} {proxy[pk]:10.1f}   {ratio:8.2f}")
    report["tp1_proxy_table"] = table


def print_proxy_table(report: dict, device: str) -> None:
    """Measured per-phase costs next to the proxy (2×H200, Llama-3.1-8B shapes, bf16, batch 1)."""
    by = {p["part"]: p.get("costs", {}) for p in report["parts"]}
    g, e = by.get("graphs-bf16", {}), by.get("eager-bf16", {})
    if device != "cuda":
        g, e = by.get("static-fp32", {}), by.get("eager-fp32", {})
        print("\n## per-phase cost (µs), CPU check of the script: the proxy is for 2×H200 bf16 and does not apply")
    else:
        print("\n## per-phase cost (µs) vs the H200 cost proxy (NVLink, batch 1, bf16; aim: within 1.3× of the graph proxy)")
    print("   phase                     graphs   eager  | proxy graph  proxy eager | graphs/proxy")
    rows = [("draft step, sharded", "sharded", "draft_step_us", ("draft_step", "sharded")),
            ("draft step, replicated", "replicated", "draft_step_us", ("draft_step", "replicated")),
            ("draft step, rank0", "rank0", "draft_step_us", None),
            ("verify of 4 tokens, TP2", "sharded", "verify4_us", ("verify4", "tp2"))]
    table = []
    for label, placement, key, proxy in rows:
        gv = g.get(placement, {}).get(key, math.nan)
        ev = e.get(placement, {}).get(key, math.nan)
        pg = PROXY_US.get((*proxy, "nvlink", "graph"), math.nan) if proxy else math.nan
        pe = PROXY_US.get((*proxy, "nvlink", "eager"), math.nan) if proxy else math.nan
        ratio = gv / pg if device == "cuda" and pg == pg else math.nan
        table.append({"phase": label, "graphs_us": gv, "eager_us": ev, "proxy_graph_us": pg, "proxy_eager_us": pe,
                      "graphs_over_proxy": ratio})
        print(f"   {label:<24} {fmt(gv, '{:8.1f}')} {fmt(ev, '{:8.1f}')} | {fmt(pg, '{:11.0f}')} {fmt(pe, '{:12.0f}')} |"
              f" {fmt(ratio, '{:8.2f}')}")
    report["proxy_table"] = table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--model-path", default=None, help="the big preset (default llama-3.1-8b on cuda, tiny-agreeing on cpu)")
    ap.add_argument("--parts", default=None, help="comma-separated part names (default: all for the device)")
    ap.add_argument("--tokens", type=int, default=None, help="new tokens per placement check (live switching: 3x)")
    ap.add_argument("--cost-tokens", type=int, default=None, help="new tokens per cost run")
    ap.add_argument("--start-timeout-s", type=float, default=420.0)
    ap.add_argument("--budget-s", type=float, default=560.0, help="start no new part after this long")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    a.tokens = a.tokens or (32 if a.device == "cuda" else 12)
    a.cost_tokens = a.cost_tokens or (48 if a.device == "cuda" else 12)
    parts = parts_for(a.device, a.model_path)
    if a.parts:
        want = a.parts.split(",")
        unknown = [w for w in want if w not in {p.name for p in parts}]
        if unknown:
            print(f"gpu_smoke: unknown part {unknown[0]!r}; parts on {a.device}: {', '.join(p.name for p in parts)}",
                  file=sys.stderr)
            return 2
        parts = [p for p in parts if p.name in want]
    t0 = time.time()
    report: dict = {"argv": sys.argv[1:], "device": a.device, "tp_size": a.tp_size, "parts": []}
    describe_gpus(a.device, report)
    print(f"# gpu_smoke on {a.device}, TP{a.tp_size}: parts {', '.join(p.name for p in parts)}")
    ok = True
    for p in parts:
        if time.time() - t0 > a.budget_s:
            print(f"\n## {p.name}: SKIPPED (time budget {a.budget_s:.0f} s spent)")
            report["parts"].append({"part": p.name, "skipped": True})
            ok = False
            continue
        ok &= run_part(p, a, report)
        if a.out:   # after every part: a run cut short by a time limit keeps what it measured
            Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    if a.tp_size == 1:
        print_tp1_ratio_table(report)
    else:
        print_proxy_table(report, a.device)
    report["ok"], report["elapsed_s"] = ok, time.time() - t0
    print(f"\n# {'PASS' if ok else 'FAIL'}: every part generated with every placement, live switching applied, "
          f"strict parts identical to plain decoding ({report['elapsed_s']:.0f} s)" if ok else
          f"\n# FAIL (see above) after {report['elapsed_s']:.0f} s")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
