"""The `smoke` command: generate across CPU ranks with speculation, switching placement and steps
midway, and print acceptance and phase times; the output must equal plain greedy decoding.

Must not import torch at module level (it runs in the parent of the spawned ranks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading

from probes.names import (DECODE_PHASES, DRAFT, DRAFT_EXTEND, DRAFT_TOKENS, PLACEMENT, RANK0, REPLICATED, SHARDED,
                          STEPS, TOPK, VERIFY)

HELP = "generate across CPU ranks with speculation, switching placement and steps midway"

# (label, changes applied before the segment)
SCHEDULE = [
    ("sharded steps=3", {STEPS: 3, PLACEMENT: SHARDED}),
    ("replicated steps=3", {PLACEMENT: REPLICATED}),
    ("rank0 steps=5", {PLACEMENT: RANK0, STEPS: 5}),
    ("tier 0 (steps=0, draft kept warm)", {STEPS: 0}),
    ("sharded steps=2", {STEPS: 2, PLACEMENT: SHARDED}),
    ("replicated tree 3/4/8", {STEPS: 3, TOPK: 4,
                               DRAFT_TOKENS: 8, PLACEMENT: REPLICATED}),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", default="tiny-agreeing")
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--tp-size", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch", type=int, default=2, help="concurrent requests")
    p.add_argument("--tokens-per-segment", type=int, default=48)
    p.add_argument("--emulate-comm-latency", default=None, help="A_us[,B_us_per_KB] per collective")
    p.add_argument("--threads-per-rank", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    from refengine.client import EngineClient, EngineOptions, EngineStartError, GenRequest

    n_seg = len(SCHEDULE)
    max_new = args.tokens_per_segment * n_seg
    opts = EngineOptions(model_path=args.model_path, speculative_draft_model_path=args.speculative_draft_model_path,
                         load_format=args.load_format, tp_size=args.tp_size, device=args.device,
                         dtype=args.dtype, speculative_num_steps=3, max_running_requests=max(args.batch, 2),
                         context_length=max_new + 64, emulate_comm_latency=args.emulate_comm_latency,
                         threads_per_rank=args.threads_per_rank)
    prompts = [[2, 40, 6], [10, 12, 14, 16], [90, 7, 3]][: args.batch] + \
        [[4 + i, 8 + i] for i in range(max(0, args.batch - 3))]
    try:
        client = EngineClient.start(opts)
    except EngineStartError as e:
        print(f"smoke: engine did not start: {e}", file=sys.stderr)
        return 1
    try:
        print(f"engine: {args.model_path} TP{args.tp_size} on {args.device}, batch {args.batch}, "
              f"{args.tokens_per_segment} tokens per segment"
              + (f", EMULATED comm latency {args.emulate_comm_latency}" if args.emulate_comm_latency else ""))
        plain = _generate(client, GenRequest, prompts, max_new, None, args.tokens_per_segment)
        spec = _generate(client, GenRequest, prompts, max_new, SCHEDULE, args.tokens_per_segment)
        same = plain == spec
        print(f"output identical to plain greedy decoding: {'yes' if same else 'NO'}")
        return 0 if same else 1
    finally:
        client.close()


def _generate(client, GenRequest, prompts, max_new, schedule, seg_tokens):
    """Run the batch to completion; with a schedule, switch config every `seg_tokens` tokens of
    the first request and print each segment's figures."""
    if schedule is None:
        client.set_config({STEPS: 0})
    else:
        epoch = client.set_config(schedule[0][1])["epoch"]
    outs = {i: [] for i in range(len(prompts))}
    done = threading.Event()
    progress = threading.Condition()
    remaining = [len(prompts)]

    def cb_for(i):
        def cb(u):
            with progress:
                outs[i].extend(u.token_ids)
                if u.finished:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()
                progress.notify_all()
        return cb

    seq, _ = client.phase_records(0, 1 << 30)
    tag = "spec" if schedule else "plain"
    for i, p in enumerate(prompts):
        client.submit(GenRequest(f"{tag}-{i}", p, max_new_tokens=max_new, ignore_eos=True), cb_for(i))
    if schedule is None:
        done.wait(600)
        return outs
    for k, (label, changes) in enumerate(schedule):
        if k > 0:
            epoch = client.set_config(changes)["epoch"]
        with progress:
            progress.wait_for(lambda: len(outs[0]) >= (k + 1) * seg_tokens or done.is_set(), timeout=600)
        seq, recs = client.phase_records(seq, 1 << 30)
        # A change shows from the first record carrying its epoch.
        _print_segment(label, [r for r in recs if r["epoch"] == epoch])
    done.wait(600)
    return outs


def _print_segment(label: str, recs: list[dict]) -> None:
    if not recs:
        print(f"  {label:<22} (no iterations)")
        return
    accepted = [a for r in recs for a in r["accepted"]]
    steps = recs[-1]["steps"]
    tau = (sum(r["committed"] for r in recs) / max(1, sum(len(r["accepted"]) for r in recs)))

    def med(key, p):
        return statistics.median(r[key][p] for r in recs)
    phases = " ".join(f"{p}={med('phase_ms', p):.2f}" for p in DECODE_PHASES)
    comm = " ".join(f"{p}={med('comm_ms', p):.2f}" for p in (DRAFT, VERIFY, DRAFT_EXTEND))
    calls = recs[-1]["comm_calls"]
    print(f"  {label:<22} iters={len(recs):3d} tau={tau:.2f} (steps {steps}, topk {recs[-1]['topk']}, mean accepted drafts "
          f"{statistics.mean(accepted) if accepted else 0:.2f})")
    print(f"  {'':<22} phase ms (median): {phases}")
    print(f"  {'':<22} comm ms (median):  {comm}  draft collectives/iter={calls['draft']}")
