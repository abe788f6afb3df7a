"""`train-tiny`: build the corpus, train the byte-level target and its EAGLE-3 head, write both.

Output directory layout (what refengine/data/tiny/ ships):
  target/   config.json, model.safetensors, tokenizer.json, tokenizer_config.json
  eagle3/   config.json, model.safetensors (fc, midlayer.*, norm, lm_head, d2t, t2d)
  train_report.json   settings, corpus digest, losses, times, hardware, quick τ figures

Must not: write anywhere but --out (and --save-corpus when asked).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from refengine.data import TINY_CORPUS_LIST, TINY_PROMPTS
from refengine.train.configs import TinyShape

DEFAULT_FILE_LIST = TINY_CORPUS_LIST
DEFAULT_PROMPTS = TINY_PROMPTS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdecode-tune train-tiny",
        description="Train the tiny byte-level Llama target and its EAGLE-3 head (training-time "
                    "test) on the Python standard library sources named by a committed file list.")
    p.add_argument("--out", type=Path, default=Path("tiny-model"), help="output directory")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own choice)")
    g = p.add_argument_group("corpus")
    g.add_argument("--file-list", type=Path, default=DEFAULT_FILE_LIST,
                   help="corpus file list (default: the shipped list)")
    g.add_argument("--stdlib-dir", type=Path, default=None,
                   help="directory holding the listed files (default: this Python's stdlib)")
    g.add_argument("--corpus", type=Path, default=None,
                   help="a corpus file saved by --save-corpus instead of reading the stdlib")
    g.add_argument("--save-corpus", type=Path, default=None,
                   help="write the checked corpus to this file and exit")
    g = p.add_argument_group("budgets")
    g.add_argument("--target-steps", type=int, default=450)
    g.add_argument("--head-steps", type=int, default=500)
    g.add_argument("--ttt-k", type=int, default=7, help="training-time-test steps (default 7)")
    g.add_argument("--target-batch", type=int, default=16)
    g.add_argument("--head-batch", type=int, default=8)
    g.add_argument("--seq-len", type=int, default=256)
    g.add_argument("--target-lr", type=float, default=2e-3)
    g.add_argument("--head-lr", type=float, default=1e-3)
    g.add_argument("--eval-every", type=int, default=0,
                   help="log held-out loss/accuracy every N steps (0 = only at the end)")
    g.add_argument("--target-from", type=Path, default=None,
                   help="reuse a trained target checkpoint directory (train only the head)")
    g.add_argument("--max-seconds", type=float, default=None,
                   help="wall-clock cap for each loop (makes the run non-reproducible)")
    g = p.add_argument_group("shape")
    d = TinyShape()
    g.add_argument("--layers", type=int, default=d.layers)
    g.add_argument("--hidden", type=int, default=d.hidden)
    g.add_argument("--heads", type=int, default=d.heads)
    g.add_argument("--kv-heads", type=int, default=d.kv_heads)
    g.add_argument("--intermediate", type=int, default=d.intermediate)
    g.add_argument("--draft-vocab", type=int, default=d.draft_vocab)
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval-prompts", type=int, default=4,
                   help="held-out prompts for the closing τ check (0 = skip)")
    g.add_argument("--eval-new-tokens", type=int, default=64)
    g.add_argument("--eval-steps", default="1,3", help="chain steps to report, comma separated")
    return p


def _log(msg: str) -> None:
    print(msg, flush=True)


def _device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train-tiny: --device cuda asked for, but torch sees no GPU")
    return dev


def _hardware(dev) -> str:
    import torch

    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)} (torch {torch.__version__})"
    return (f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads "
            f"(torch {torch.__version__})")


def load_corpus_for(args):
    from refengine.train import corpus as C

    file_list = C.read_file_list(args.file_list)
    if args.corpus is not None:
        return file_list, C.load_corpus(args.corpus, file_list.digest)
    stdlib = args.stdlib_dir or C.default_stdlib_dir()
    return file_list, C.build_corpus(file_list, stdlib)


def run(args) -> int:
    import torch

    from refengine.train import checkpoint, configs, models, trainer
    from refengine.train import corpus as C
    from refengine.train.draft_vocab import coverage, draft_vocab, token_counts
    from refengine.train.byte_tokenizer import VOCAB_SIZE, encode

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ttt_k < 1:
        raise SystemExit("train-tiny: --ttt-k must be at least 1")
    t_start = time.perf_counter()
    try:
        file_list, corpus = load_corpus_for(args)
    except C.CorpusError as exc:
        print(f"train-tiny: {exc}", file=sys.stderr)
        return 2
    _log(f"corpus: {len(file_list.entries)} files ({file_list.source}), digest "
         f"{corpus.digest[:12]}…, {corpus.train.numel():,} train / {corpus.val.numel():,} val tokens")
    if args.save_corpus is not None:
        C.save_corpus(corpus, args.save_corpus)
        _log(f"corpus written to {args.save_corpus}")
        return 0

    dev = _device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    shape = configs.TinyShape(layers=args.layers, hidden=args.hidden, heads=args.heads,
                              kv_heads=args.kv_heads, intermediate=args.intermediate,
                              head_intermediate=args.intermediate, draft_vocab=args.draft_vocab)
    tcfg, hcfg = configs.target_config(shape), configs.head_config(shape)
    aux_ids = shape.aux_layer_ids
    _log(f"target: L={shape.layers} H={shape.hidden} heads {shape.heads}/{shape.kv_heads} "
         f"I={shape.intermediate}, aux layers {aux_ids}; device {dev} ({_hardware(dev)})")

    target = models.build_target(tcfg)
    if args.target_from is not None:
        tcfg = json.loads((args.target_from / "config.json").read_text())
        if tcfg != configs.target_config(shape):
            raise SystemExit(f"train-tiny: {args.target_from} has another shape than the flags")
        checkpoint.load_state(target, args.target_from / "model.safetensors")
        target = target.to(dev)
        t_res = trainer.LoopResult(0, 0.0, 0, float("nan"), False)
        _log(f"target: loaded from {args.target_from}")
    else:
        target = target.to(dev)
        tloop = trainer.LoopConfig(steps=args.target_steps, batch=args.target_batch,
                                   seq_len=args.seq_len, lr=args.target_lr,
                                   warmup=min(50, max(1, args.target_steps // 10)), clip=1.0,
                                   max_seconds=args.max_seconds, eval_every=args.eval_every)
        t_res = trainer.train_target(target, corpus.train, tloop, aux_ids, dev, args.seed, _log,
                                     corpus.val)
    val_loss = trainer.eval_target_loss(target, corpus.val, args.seq_len, 4, args.target_batch,
                                        aux_ids, dev)
    _log(f"target: {t_res.steps} steps in {t_res.seconds:.0f}s, val {val_loss:.3f} nats/byte")

    counts = token_counts(corpus.train, VOCAB_SIZE)
    d2t, t2d = draft_vocab(counts, shape.draft_vocab)
    _log(f"draft vocab: {shape.draft_vocab} ids covering {coverage(counts, t2d):.5%} of train tokens")
    head = models.build_head(hcfg)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    head = head.to(dev)
    hloop = trainer.LoopConfig(steps=args.head_steps, batch=args.head_batch, seq_len=args.seq_len,
                               lr=args.head_lr, warmup=min(50, max(1, args.head_steps // 10)),
                               clip=0.5, max_seconds=args.max_seconds, eval_every=args.eval_every)
    h_res = trainer.train_head(head, target, corpus.train, hloop, args.ttt_k, hcfg, aux_ids, dev,
                               args.seed + 1, _log, corpus.val)
    _log(f"head: {h_res.steps} steps in {h_res.seconds:.0f}s")

    out = Path(args.out)
    checkpoint.save_target(target, tcfg, out / "target")
    checkpoint.save_head(head, hcfg, out / "eagle3")
    report = {
        "command": " ".join(["train-tiny", *getattr(args, "argv", [])]),
        "seed": args.seed, "device": str(dev), "hardware": _hardware(dev),
        "corpus": {"digest": corpus.digest, "source": file_list.source,
                   "train_tokens": corpus.train.numel(), "val_tokens": corpus.val.numel()},
        "shape": shape.to_dict(),
        "target": {"from": str(args.target_from) if args.target_from else None,
                   "steps": t_res.steps, "seconds": round(t_res.seconds, 1),
                   "tokens": t_res.tokens, "batch": args.target_batch, "seq_len": args.seq_len,
                   "lr": args.target_lr, "final_train_loss": None if t_res.steps == 0 else round(t_res.final_loss, 4),
                   "val_loss": round(val_loss, 4), "stopped_by_time": t_res.stopped_by_time,
                   "kept_step": t_res.best_step, "eval_every": args.eval_every,
                   "history": t_res.history},
        "head": {"steps": h_res.steps, "seconds": round(h_res.seconds, 1), "tokens": h_res.tokens,
                 "batch": args.head_batch, "ttt_k": args.ttt_k, "lr": args.head_lr,
                 "final_loss": round(h_res.final_loss, 4), "stopped_by_time": h_res.stopped_by_time,
                 "history": h_res.history},
        "draft_vocab_coverage": coverage(counts, t2d),
    }
    if args.eval_prompts > 0:
        from refengine.train.evaluate import mean_tau

        target_cpu, head_cpu = target.to("cpu"), head.to("cpu")
        prompts = [encode(r["prompt"].encode())
                   for r in C.read_prompts(DEFAULT_PROMPTS)[: args.eval_prompts]] \
            if DEFAULT_PROMPTS.exists() else [corpus.val[i * 997:i * 997 + 96]
                                              for i in range(args.eval_prompts)]
        taus = {}
        for s in [int(x) for x in args.eval_steps.split(",") if x]:
            taus[s] = round(mean_tau(target_cpu, head_cpu, hcfg, aux_ids, prompts,
                                     args.eval_new_tokens, s), 3)
            _log(f"chain τ (greedy, {len(prompts)} held-out prompts, recomputed): steps {s}: {taus[s]}")
        report["quick_tau_greedy"] = taus
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    _log(f"wrote {out / 'target'}, {out / 'eagle3'} and train_report.json "
         f"in {report['total_seconds']:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return run(args)

