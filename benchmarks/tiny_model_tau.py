"""Acceptance length τ of the shipped tiny model (or any target + EAGLE-3 head) on held-out prompts.

Greedy chains run through the engine's real speculative loop (EngineClient, one CPU rank,
float32): for every chain length the outputs are also checked against plain greedy decoding
(speculation must not change them). Temperature 1 runs through refengine.train.evaluate (the
recomputing chain evaluator with SGLang's target-only acceptance rule), because the engine has no
sampling path yet; it says so in its output. τ = (correct drafts + verifies) / verifies, i.e.
accepted drafts + the bonus token per verify, as SGLang's spec_accept_length.

  python benchmarks/tiny_model_tau.py                      # shipped model, steps 1..7
  python benchmarks/tiny_model_tau.py --draft DIR --label K=1   # another head on the same target

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
               steps_list: list[int], batch: int) -> tuple[dict[int, float], dict[int, bool], float]:
    from refengine.client import EngineClient, EngineOptions, GenRequest

    opts = EngineOptions(model_path=target, speculative_draft_model_path=draft, load_format="auto",
                         tp_size=1, device="cpu", dtype="float32", speculative_num_steps=1,
                         max_running_requests=batch,
                         context_length=max(len(p) for p in prompts) + new_tokens + 16,
                         threads_per_rank=1, init_timeout_s=120)
    client = EngineClient.start(opts)
    counter = [0]

    def run(steps: int) -> tuple[list[list[int]], int, int]:
        client.set_config({"speculative_num_steps": steps})
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
                                         ignore_eos=True), cb_for(i))
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
        plain, _, _ = run(0)
        taus, same = {}, {}
        for s in steps_list:
            outs, verifies, correct = run(s)
            taus[s] = (correct + verifies) / verifies if verifies else float("nan")
            same[s] = outs == plain
        return taus, same, time.perf_counter() - t0
    finally:
        client.close()


def sampled_tau(target: str, draft: str, prompts: list[list[int]], new_tokens: int,
                steps_list: list[int], temperature: float, seed: int) -> dict[int, float]:
    import torch

    from refengine.loader import load_eagle3, load_llama
    from refengine.train.evaluate import mean_tau

    t = load_llama(target).eval()
    h = load_eagle3(draft).eval()
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from refengine.train.corpus import read_prompts

    prompts = [list(r["prompt"].encode()) for r in read_prompts(TINY_PROMPTS)[: args.prompts]]
    steps = [int(s) for s in args.steps.split(",")]
    taus, same, secs = engine_tau(args.target, args.draft, prompts, args.new_tokens, steps,
                                  args.batch)
    result = {"label": args.label, "prompts": len(prompts), "new_tokens": args.new_tokens,
              "greedy_engine": taus, "greedy_equals_plain": same, "engine_seconds": round(secs, 1)}
    header = "| " + " | ".join(["setting"] + [f"s={s}" for s in steps]) + " |"
    rule = "|" + "---|" * (len(steps) + 1)
    rows = [f"| {args.label}, greedy (engine) | " + " | ".join(f"{taus[s]:.2f}" for s in steps) + " |"]
    if args.temperature_one:
        t1 = sampled_tau(args.target, args.draft, prompts, args.new_tokens, steps, 1.0, args.seed)
        result["t1_evaluator"] = t1
        rows.append(f"| {args.label}, T=1 (evaluator) | "
                    + " | ".join(f"{t1[s]:.2f}" for s in steps) + " |")
    print(f"τ on {len(prompts)} held-out prompts, {args.new_tokens} new tokens each "
          f"(chain, topk 1); greedy outputs identical to plain decoding: "
          f"{'yes' if all(same.values()) else 'NO ' + str(same)}")
    print("\n".join([header, rule, *rows]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
