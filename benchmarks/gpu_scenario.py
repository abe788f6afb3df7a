"""The motivating scenario on the reference engine: draft placement × steps 1..7 × interconnect,
batch 1 and 8, the acceptance simulator set to a published curve (random weights accept nothing),
printing decode tok/s, per-phase times and their collective parts, ratios against no speculation
and against the sharded draft, all measured side by side in one run. TP size is a parameter, so
the same script serves the H200 pair (TP2) and eight GPUs (TP8); `--check-greedy` first checks
greedy speculative output ≡ plain decoding for every placement (simulator off).

GPU (each planned to finish within 10 minutes; NCCL knobs per interconnect reach every rank through
the environment):
    python benchmarks/gpu_scenario.py --device cuda --tp-size 2 --out results.json
    python benchmarks/gpu_scenario.py --device cuda --tp-size 8 --out results.json
CPU check of the script (gloo ranks, tiny shapes; "emulated" adds the slow link's latency):
    python benchmarks/gpu_scenario.py --device cpu --tp-size 2 --model-path tiny-agreeing \\
        --interconnects nvlink,emulated --steps 1,3 --batches 1,2 --iterations 8 --check-greedy

On CPU the NCCL variables are set but have no effect (gloo): interconnect "nvlink" means plain
gloo there. Iterations that captured a graph are excluded from every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

from engine_runs import (EMULATED_SLOW, INTERCONNECTS, PHASES, PROXY_US, Load, base_env, curve_tau,  # noqa: E402
                         describe_gpus, fmt, graph_keys, measure, published_curve)

PLACEMENTS = ("sharded", "replicated", "rank0")


def _ints(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--model-path", default=None, help="preset (default: llama-3.1-8b on cuda, tiny-agreeing on cpu)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--steps", default="1-7", help="e.g. 1-7 or 1,3")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--interconnects", default="nvlink,slow",
                    help="nvlink (as is), slow (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), emulated (CPU: added latency)")
    ap.add_argument("--iterations", type=int, default=30, help="measured iterations per setting")
    ap.add_argument("--settle", type=int, default=3)
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--cuda-graph", default="auto", choices=("auto", "off", "static", "cuda"))
    ap.add_argument("--check-greedy", action="store_true",
                    help="first: greedy speculative output == plain decoding for every placement (simulator off)")
    ap.add_argument("--check-tokens", type=int, default=24)
    ap.add_argument("--check-dtype", default=None,
                    help="dtype of the greedy check (default float32 on cuda: bf16 near-ties would flip "
                         "greedy tokens on random 8B weights; the run's dtype on cpu)")
    ap.add_argument("--threads-per-rank", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new settings after this long")
    ap.add_argument("--out", default=None, help="write every figure as JSON here")
    a = ap.parse_args(argv)
    a.model_path = a.model_path or ("llama-3.1-8b" if a.device == "cuda" else "tiny-agreeing")
    a.threads_per_rank = a.threads_per_rank or (1 if a.device == "cpu" else None)
    a.check_dtype = a.check_dtype or ("float32" if a.device == "cuda" else a.dtype)
    return a


def engine_opts(a, interconnect: str | None, simulate: str | None, dtype: str | None = None):
    from refengine.client import EngineOptions

    env = base_env()
    emulate = None
    if interconnect == "emulated":
        emulate = EMULATED_SLOW
    elif interconnect is not None:
        env.update(INTERCONNECTS[interconnect])
    return EngineOptions(model_path=a.model_path, load_format="dummy", tp_size=a.tp_size, device=a.device,
                         dtype=dtype or a.dtype, speculative_num_steps=1, max_running_requests=max(_ints(a.batches)),
                         context_length=a.context_length, speculative_simulate_accept=simulate,
                         emulate_comm_latency=emulate, threads_per_rank=a.threads_per_rank, env=env,
                         cuda_graph=a.cuda_graph, cuda_graph_timing=True, cuda_graph_log=False, init_timeout_s=120)


def check_greedy(a, report: dict) -> bool:
    """Greedy: plain decoding vs every placement at steps 1 and 3 (chain) and a tree, batch 2."""
    from refengine.client import EngineClient, GenRequest

    t0 = time.time()
    client = EngineClient.start(engine_opts(a, None, None, a.check_dtype))
    print(f"\n## greedy check: {a.model_path} TP{a.tp_size} {a.device} {a.check_dtype} "
          f"(started in {time.time() - t0:.1f} s; graphs: {client.graph_info()[0]['mode']})")
    prompts = [[2, 40, 6], [10, 12, 14, 16, 18]]     # even ids: the agreeing presets' drafts get accepted
    ok = True
    try:
        def run(config: dict, tag: str) -> tuple[list[list[int]], float]:
            import threading

            client.set_config(config)
            seq, _ = client.phase_records(0, 1 << 30)
            outs: list[list[int]] = [[] for _ in prompts]
            done = threading.Semaphore(0)

            def cb(i):
                def f(u):
                    outs[i].extend(u.token_ids)
                    if u.finished:
                        done.release()
                return f
            for i, p in enumerate(prompts):
                client.submit(GenRequest(f"{tag}-{i}", p, max_new_tokens=a.check_tokens, ignore_eos=True), cb(i))
            for _ in prompts:
                if not done.acquire(timeout=300):
                    raise TimeoutError(f"{tag}: generation did not finish")
            _, recs = client.phase_records(seq, 1 << 30)
            spec = [r for r in recs if r["steps"] > 0]
            tau = sum(r["committed"] for r in spec) / max(1, sum(r["bs"] for r in spec))
            return outs, tau

        plain, _ = run({"speculative_num_steps": 0}, "plain")
        rows = []
        configs = [({"speculative_num_steps": s, "speculative_eagle_topk": 1}, f"chain steps={s}") for s in (1, 3)]
        configs.append(({"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8},
                        "tree 3/4/8"))
        for placement in _placements(a):
            for cfg, label in configs:
                outs, tau = run({**cfg, "speculative_draft_placement": placement}, f"{placement}-{label}")
                same = outs == plain
                ok &= same
                rows.append({"placement": placement, "config": label, "identical": same, "tau": tau})
                print(f"  {placement:<10} {label:<14} identical to plain: {'yes' if same else 'NO'}  τ={tau:.2f}")
                client.set_config({"speculative_eagle_topk": 1, "speculative_num_steps": 1})
        report["greedy_check"] = {"rows": rows, "all_identical": ok, "tokens": a.check_tokens, "batch": len(prompts)}
        print(f"  greedy speculative output ≡ plain for every placement: {'PASS' if ok else 'FAIL'}")
    finally:
        client.close()
    return ok


def _placements(a) -> list[str]:
    return [p for p in a.placements.split(",") if p]


def run_interconnect(a, interconnect: str, curve: tuple[float, ...], report: dict, t_start: float) -> None:
    from refengine.client import EngineClient

    simulate = ",".join(f"{x:g}" for x in curve)
    t0 = time.time()
    client = EngineClient.start(engine_opts(a, interconnect, simulate))
    env = client.rank_env()
    info = client.graph_info()[0]
    label = interconnect + (f" (EMULATED {EMULATED_SLOW} µs per collective)" if interconnect == "emulated" else "")
    if a.device == "cpu" and interconnect != "emulated":
        label += " (CPU ranks: gloo; the NCCL variables have no effect)"
    print(f"\n## interconnect {label}: {a.model_path} TP{a.tp_size} {a.device} {a.dtype}; started in "
          f"{time.time() - t0:.1f} s; graphs: {info['mode']}" + (f" ({info['off_reason']})" if info.get("off_reason") else ""))
    print(f"   NCCL environment on every rank: {env[0] if all(e == env[0] for e in env) else env}")
    rows = []
    vocab = client.model_info()["vocab_size"]
    out_of_time = False
    try:
        for batch in _ints(a.batches):
            if out_of_time:
                break
            load = Load(client, vocab, batch, max_new=min(2048, a.context_length - 64))
            load.start()
            try:
                base = measure(client, {"speculative_num_steps": 0}, batch, a.iterations, a.settle)
                rows.append(_row(interconnect, "none", 0, batch, base, base, None))
                by_sharded = {}
                for steps in _ints(a.steps):
                    for placement in _placements(a):
                        if time.time() - t_start > a.budget_s:
                            out_of_time = True
                            break
                        m = measure(client, {"speculative_num_steps": steps, "speculative_eagle_topk": 1,
                                             "speculative_draft_placement": placement}, batch, a.iterations, a.settle)
                        if placement == "sharded":
                            by_sharded[steps] = m
                        rows.append(_row(interconnect, placement, steps, batch, m, base, by_sharded.get(steps)))
                    if out_of_time:
                        break
            finally:
                load.stop()
                if load.errors:
                    print(f"   load errors: {load.errors[:3]}")
        if out_of_time:
            print(f"   SKIPPED the rest of this interconnect: time budget {a.budget_s:.0f} s spent")
        _print_table(rows, curve)
        time.sleep(1.5)   # ranks send their statistics every 0.25 s while busy, every 1 s while idle
        keys = graph_keys(client)
        _print_graph_keys(keys, info["mode"])
        if a.device == "cuda" and a.tp_size == 2 and info["mode"] == "cuda":
            _print_vs_proxy(keys, interconnect)
        for rank, st in sorted(client.stats()["per_rank"].items()):
            g = st.get("graphs") or {}
            if rank == 0 or g.get("failures"):
                print(f"   rank {rank} graphs: {g.get('captures', 0)} captures in {g.get('capture_ms', 0):.0f} ms, "
                      f"{g.get('replays', 0)} replays, {g.get('evictions', 0)} evictions, failures {g.get('failures') or 'none'}")
        report["interconnects"].append({"interconnect": interconnect, "emulated": interconnect == "emulated",
                                        "rank_env": env, "graphs": info, "rows": rows, "graph_keys": keys})
    finally:
        client.close()


def _row(interconnect, placement, steps, batch, m, base, sharded) -> dict:
    s = m.summary()
    s.update({"interconnect": interconnect, "placement": placement, "steps": steps,
              "vs_no_spec": s["tok_per_s"] / base.tok_per_s() if base.records else math.nan,
              "vs_sharded": (s["tok_per_s"] / sharded.tok_per_s()) if sharded is not None and sharded.records else math.nan})
    return s


def _print_table(rows: list[dict], curve) -> None:
    print("   batch placement  steps τ(sim/meas)   tok/s   ×nospec ×sharded | draft  (comm)  step  | verify (comm) | "
          "v_sample | extend (comm) | other  [ms; comm — = inside graphs, see traces] calls draft/verify (in graph)")
    for r in rows:
        ph, cm = r["phase_ms"], r["comm_ms"]
        want = curve_tau(curve, r["steps"]) if r["steps"] else 1.0
        print(f"   {r['batch']:>5} {r['placement']:<10} {r['steps']:>5} {want:4.2f}/{fmt(r['tau'])} {fmt(r['tok_per_s'], '{:8.1f}')}"
              f" {fmt(r['vs_no_spec'], '{:7.3f}')} {fmt(r['vs_sharded'], '{:8.3f}')} |"
              f" {fmt(ph['draft'], '{:6.3f}')} ({fmt(cm['draft'], '{:5.3f}')}) {fmt(r['draft_step_ms'], '{:5.3f}')} |"
              f" {fmt(ph['verify'], '{:6.3f}')} ({fmt(cm['verify'], '{:5.3f}')}) | {fmt(ph['verify_sample'], '{:6.3f}')}   |"
              f" {fmt(ph['draft_extend'], '{:6.3f}')} ({fmt(cm['draft_extend'], '{:5.3f}')}) | {fmt(ph['other'], '{:6.3f}')}"
              f"  {r['comm_calls']['draft']}/{r['comm_calls']['verify']}"
              f" ({r['comm_calls_in_graph']['draft']}/{r['comm_calls_in_graph']['verify']})"
              + ("  TIMED OUT" if r["timed_out"] else ""))


def _print_graph_keys(keys: list[dict], mode: str) -> None:
    rank0 = [k for k in keys if k["rank"] == 0 and k["replays"] and k["replay_ms_mean"] is not None]
    if not rank0:
        return
    how = "CUDA events around each replay" if mode == "cuda" else "host clock around each re-execution (static stand-in)"
    print(f"   rank 0 graph replays (mean µs per replay, {how}; collectives inside):")
    for k in sorted(rank0, key=lambda k: (k["phase"], k["placement"], k["rows"], k["shape"])):
        print(f"     {k['key']:<44} replays {k['replays']:>6}  {k['replay_ms_mean'] * 1e3:9.1f} µs  "
              f"collectives {k['comm_calls']}" + (f"  EAGER: {k['eager']}" if k["eager"] else ""))


def _print_vs_proxy(keys: list[dict], interconnect: str) -> None:
    """Rank 0's mean graph replay per call at batch 1 next to the H200 cost proxy (TP2, bf16)."""
    def mean_us(pred) -> float:
        ks = [k for k in keys if k["rank"] == 0 and k["rows"] == 1 and k["replays"] and pred(k)]
        n = sum(k["replays"] for k in ks)
        return sum(k["replay_ms_mean"] * k["replays"] for k in ks) / n * 1e3 if n else math.nan

    print(f"   batch-1 graph replays vs the cost proxy ({interconnect}; aim: within 1.3x):")
    rows = [(f"draft step, {p}", lambda k, p=p: k["phase"] == "draft_step" and k["placement"] == p and k["shape"][0] == 1,
             ("draft_step", p if p != "rank0" else "replicated")) for p in PLACEMENTS]
    rows.append(("verify of 4 tokens", lambda k: k["phase"] == "verify" and k["shape"][0] == 4, ("verify4", "tp2")))
    for label, pred, proxy in rows:
        got = mean_us(pred)
        ref = PROXY_US.get((*proxy, interconnect, "graph"), math.nan)
        print(f"     {label:<24} {fmt(got, '{:8.1f}')} µs   proxy {fmt(ref, '{:7.0f}')} µs   ratio {fmt(got / ref, '{:5.2f}')}")


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.time()
    curve = published_curve()
    print(f"# gpu_scenario: {a.model_path} TP{a.tp_size} on {a.device}; steps {a.steps}; batches {a.batches}; "
          f"interconnects {a.interconnects}; SIMULATED acceptance, curve α = {curve} "
          f"(τ(2..7) = vLLM's published Llama-3.1-8B EAGLE-3 figures; α1 assumed)")
    report: dict = {"argv": sys.argv[1:], "device": a.device, "tp_size": a.tp_size, "model_path": a.model_path,
                    "curve": curve, "interconnects": []}
    describe_gpus(a.device, report)
    ok = True
    if a.check_greedy:
        ok = check_greedy(a, report)
    for ic in [x for x in a.interconnects.split(",") if x]:
        if time.time() - t_start > a.budget_s:
            print(f"\n## interconnect {ic}: SKIPPED (time budget {a.budget_s:.0f} s spent)")
            continue
        run_interconnect(a, ic, curve, report, t_start)
        if a.out:   # after every interconnect: a run cut short by a time limit keeps what it measured
            Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    report["elapsed_s"] = time.time() - t_start
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"\n# done in {report['elapsed_s']:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
