"""Acceptance length τ of the shipped tiny model (or any target + EAGLE-3 head) on held-out prompts.

Greedy chains run through the engine's real speculative loop (EngineClient, one CPU rank,
float32): for every chain length the outputs are also checked against plain greedy decoding
(speculation must not change them). Temperature 1 runs through refengine.train.evaluate (the
recomputing chain evaluator with SGLang's target-only acceptance rule), because the engine has no
sampling path yet; it says so in its output. τ = (correct drafts + verifies) / verifies, i.e.
accepted drafts + the bonus token per verify, as SGLang's spec_accept_length.

  python benchmarks/tiny_model_tau.py                      # shipped model, steps 1..7
  python benchmarks/tiny_model_tau.py --draft DIR --label K=1   # another head on the same target
  python benchmarks/tiny_model_tau.py --evaluator-only --temperature-one --device cuda

Prints a markdown table; --json writes the figures too.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path


def engine_tau(target: str, draft: str, prompts: list[list[int]], new_tokens: int,
               settings: list[dict], batch: int, temperature: float = 0.0, seed: int = 0,
               device: str = "cpu") -> tuple[list[float], list[bool], float]:
    """τ per speculative setting (dicts of /set_internal_state keys), and whether each setting's
    outputs equal plain decoding (expected at temperature 0 only)."""
    from refengine.client import EngineClient, EngineOptions, GenRequest

    opts = EngineOptions(model_path=target, speculative_draft_model_path=draft, load_format="auto",
                         tp_size=1, device=device, dtype="float32", speculative_num_steps=1,
                         max_running_requests=batch,
                         context_length=max(len(p) for p in prompts) + new_tokens + 16,
                         threads_per_rank=1, init_timeout_s=120)
    client = EngineClient.start(opts)
    counter = [0]

    def run(setting: dict) -> tuple[list[list[int]], int, int]:
        client.set_config(setting)
        outs, verifies, correct = [], 0, 0
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            toks = [[] for _ in chunk]
            finals = [None] * len(chunk)
            cond = threading.Condition()

            def cb_for(i):
                def cb(u):
                    with cond:
                        toks[i].extend(u.token_ids)
                        if u.finished:
                            finals[i] = u
                        cond.notify_all()
                return cb

            counter[0] += 1
            for i, p in enumerate(chunk):
                client.submit(GenRequest(f"b{counter[0]}-{i}", p, max_new_tokens=new_tokens,
                                         ignore_eos=True, temperature=temperature,
                                         seed=seed + start + i), cb_for(i))
            with cond:
                if not cond.wait_for(lambda: all(f is not None for f in finals), timeout=900):
                    raise RuntimeError("generation timed out")
            for f in finals:
                if f.finish_reason == "error":
                    raise RuntimeError(f"engine refused a request: {f.error}")
                if f.spec is not None:
                    verifies += f.spec.spec_verify_ct
                    correct += f.spec.spec_num_correct_drafts
            outs += toks
        return outs, verifies, correct

    try:
        t0 = time.perf_counter()
        plain, _, _ = run({"speculative_num_steps": 0})
        taus, same = [], []
        for setting in settings:
            outs, verifies, correct = run(setting)
            taus.append((correct + verifies) / verifies if verifies else float("nan"))
            same.append(outs == plain)
        return taus, same, time.perf_counter() - t0
    finally:
        client.close()


def evaluator_tau(target: str, draft: str, prompts: list[list[int]], new_tokens: int,
                  steps_list: list[int], temperature: float, seed: int, device: str = "cpu"
                  ) -> dict[int, float]:
    import torch

    from refengine.loader import load_eagle3, load_llama
    from refengine.train.evaluate import mean_tau

    t = load_llama(target).to(device).eval()
    h = load_eagle3(draft).to(device).eval()
    hcfg = json.loads((Path(draft) / "config.json").read_text())
    ps = [torch.tensor(p) for p in prompts]
    return {s: mean_tau(t, h, hcfg, list(t.aux_layer_ids), ps, new_tokens, s, temperature, seed)
            for s in steps_list}


def main(argv: list[str] | None = None) -> int:
    from refengine.data import TINY_DRAFT_DIR, TINY_PROMPTS, TINY_TARGET_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=str(TINY_TARGET_DIR))
    p.add_argument("--draft", default=str(TINY_DRAFT_DIR))
    p.add_argument("--label", default="shipped (K=7)")
    p.add_argument("--prompts", type=int, default=16, help="first N held-out prompts")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--steps", default="1,2,3,4,5,6,7")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--temperature-one", action="store_true",
                   help="also measure τ at temperature 1 (recomputing evaluator)")
    p.add_argument("--evaluator-only", action="store_true",
                   help="skip the engine: greedy τ from the recomputing evaluator too")
    p.add_argument("--device", default="cpu", help="device of the recomputing evaluator")
    p.add_argument("--engine-device", default="cpu", help="cpu or cuda (one rank, float32)")
    p.add_argument("--engine-temperature-one", action="store_true",
                   help="also measure τ at temperature 1 in the engine (sampling verification)")
    p.add_argument("--trees", default="",
                   help='engine tree settings "steps,topk,N;..." e.g. "3,4,8;5,4,16"')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from refengine.train.corpus import read_prompts

    prompts = [list(r["prompt"].encode()) for r in read_prompts(TINY_PROMPTS)[: args.prompts]]
    steps = [int(s) for s in args.steps.split(",")]
    result = {"label": args.label, "prompts": len(prompts), "new_tokens": args.new_tokens}
    rows, tree_rows = [], []
    same = {}
    if args.evaluator_only:
        taus = evaluator_tau(args.target, args.draft, prompts, args.new_tokens, steps, 0.0,
                             args.seed, args.device)
        result["greedy_evaluator"] = taus
        rows.append(f"| {args.label}, greedy (evaluator) | "
                    + " | ".join(f"{taus[s]:.2f}" for s in steps) + " |")
    else:
        chain = [{"speculative_num_steps": k, "speculative_eagle_topk": 1,
                  "speculative_num_draft_tokens": k + 1} for k in steps]
        tl, sl, secs = engine_tau(args.target, args.draft, prompts, args.new_tokens, chain,
                                  args.batch, device=args.engine_device)
        taus, same = dict(zip(steps, tl)), dict(zip(steps, sl))
        result.update(greedy_engine=taus, greedy_equals_plain=same, engine_seconds=round(secs, 1))
        rows.append(f"| {args.label}, greedy (engine) | "
                    + " | ".join(f"{taus[s]:.2f}" for s in steps) + " |")
        if args.engine_temperature_one:
            tl, _, _ = engine_tau(args.target, args.draft, prompts, args.new_tokens, chain,
                                  args.batch, 1.0, args.seed, args.engine_device)
            result["t1_engine"] = dict(zip(steps, tl))
            rows.append(f"| {args.label}, T=1 (engine) | " + " | ".join(f"{t:.2f}" for t in tl)
                        + " |")
        if args.trees:
            trees = [tuple(int(x) for x in t.split(",")) for t in args.trees.split(";")]
            cfgs = [{"speculative_num_steps": a, "speculative_eagle_topk": b,
                     "speculative_num_draft_tokens": c} for a, b, c in trees]
            for temp in (0.0, 1.0) if args.engine_temperature_one else (0.0,):
                tl, sl, _ = engine_tau(args.target, args.draft, prompts, args.new_tokens, cfgs,
                                       args.batch, temp, args.seed, args.engine_device)
                for (a, b, c), t, ok in zip(trees, tl, sl):
                    key = f"tree s={a} topk={b} N={c} T={temp:g}"
                    result[key] = t
                    if temp == 0.0:
                        same[key] = ok
                    tree_rows.append(f"| {args.label}, tree steps {a}, topk {b}, "
                                     f"{c} draft tokens, T={temp:g} (engine) | {t:.2f} |")
    header = "| " + " | ".join(["setting"] + [f"s={s}" for s in steps]) + " |"
    rule = "|" + "---|" * (len(steps) + 1)
    if args.temperature_one:
        t1 = evaluator_tau(args.target, args.draft, prompts, args.new_tokens, steps, 1.0,
                           args.seed, args.device)
        result["t1_evaluator"] = t1
        rows.append(f"| {args.label}, T=1 (evaluator) | "
                    + " | ".join(f"{t1[s]:.2f}" for s in steps) + " |")
    check = ("" if not same else "; engine greedy outputs identical to plain decoding: "
             + ("yes" if all(same.values()) else "NO " + str(same)))
    print(f"τ on {len(prompts)} held-out prompts, {args.new_tokens} new tokens each "
          f"(chain, topk 1){check}")
    print("\n".join([header, rule, *rows]))
    if tree_rows:
        print("\n| tree setting | τ |\n|---|---|\n" + "\n".join(tree_rows))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
