"""The two training loops: next-byte target pre-training, then the EAGLE-3 head with TTT.

Both draw random fixed-length windows from the corpus with a seeded generator, use AdamW with linear
warm-up and cosine decay, clip gradients, print progress lines, and stop at a step budget (or an
optional wall-clock cap, which makes the run non-reproducible and is reported as such).

Must not: parse command lines or write files (the CLI does both).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from refengine.train import models
from refengine.train.ttt import ttt_loss, ttt_unroll


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    batch: int
    seq_len: int
    lr: float
    warmup: int
    clip: float
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    max_seconds: float | None = None
    log_every: int = 25
    eval_every: int = 0  # 0 = no held-out evaluation during the loop


@dataclass
class LoopResult:
    steps: int
    seconds: float
    tokens: int
    final_loss: float
    stopped_by_time: bool
    history: list[dict] = field(default_factory=list)
    best_val_loss: float | None = None
    best_step: int | None = None


def lr_at(step: int, cfg: LoopConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def sample_windows(tokens: torch.Tensor, batch: int, length: int, gen: torch.Generator
                   ) -> torch.Tensor:
    if tokens.numel() <= length:
        raise ValueError(f"corpus split has {tokens.numel()} tokens, windows need {length + 1}")
    starts = torch.randint(0, tokens.numel() - length, (batch,), generator=gen)
    return torch.stack([tokens[s:s + length] for s in starts.tolist()])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_loop(params, cfg: LoopConfig, step_fn: Callable[[int], tuple[torch.Tensor, dict]],
              device: torch.device, label: str, log: Callable[[str], None],
              eval_fn: Callable[[int], dict] | None = None) -> LoopResult:
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    params = [p for g in opt.param_groups for p in g["params"]]
    t0 = time.perf_counter()
    history, loss_val, step = [], float("nan"), 0
    stopped_by_time = False
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss, extra = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        last = step == cfg.steps - 1
        evaluated = eval_fn is not None and bool(cfg.eval_every) and (
            step % cfg.eval_every == 0 or last)
        if evaluated:
            extra.update(eval_fn(step + 1))
        if step % cfg.log_every == 0 or last or evaluated:
            loss_val = loss.item()
            elapsed = time.perf_counter() - t0
            tok_s = (step + 1) * cfg.batch * cfg.seq_len / max(elapsed, 1e-9)
            rec = {"step": step, "loss": round(loss_val, 4), "lr": lr_at(step, cfg),
                   "elapsed_s": round(elapsed, 1), **extra}
            history.append(rec)
            more = " ".join(f"{k} {v}" for k, v in extra.items())
            log(f"[{label}] step {step + 1}/{cfg.steps} loss {loss_val:.4f} "
                f"lr {rec['lr']:.2e} {tok_s:,.0f} tok/s {elapsed:.0f}s {more}")
        if cfg.max_seconds is not None and time.perf_counter() - t0 > cfg.max_seconds:
            stopped_by_time = True
            log(f"[{label}] stopping at step {step + 1}: wall-clock cap {cfg.max_seconds:.0f}s")
            break
    _sync(device)
    done = step + 1
    return LoopResult(done, time.perf_counter() - t0, done * cfg.batch * cfg.seq_len,
                      loss.item(), stopped_by_time, history)


def train_target(target, train_tokens: torch.Tensor, cfg: LoopConfig, aux_ids: list[int],
                 device: torch.device, seed: int, log: Callable[[str], None],
                 val_tokens: torch.Tensor | None = None) -> LoopResult:
    gen = torch.Generator().manual_seed(seed)
    target.train()

    def step_fn(step: int):
        w = sample_windows(train_tokens, cfg.batch, cfg.seq_len + 1, gen).to(device)
        logits, _ = models.target_forward(target, w[:, :-1], aux_ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 w[:, 1:].reshape(-1))
        return loss, {}

    best: dict = {"loss": float("inf"), "step": None, "state": None}

    def eval_fn(done: int) -> dict:
        if val_tokens is None:
            return {}
        target.eval()
        v = eval_target_loss(target, val_tokens, cfg.seq_len, 2, cfg.batch, aux_ids, device)
        target.train()
        if v < best["loss"]:
            # Early stopping on held-out loss: a byte model of this size overfits 4 MB of text.
            best.update(loss=v, step=done,
                        state={k: t.detach().clone() for k, t in target.state_dict().items()})
        return {"val_loss": round(v, 4)}

    result = _run_loop(list(target.parameters()), cfg, step_fn, device, "target", log, eval_fn)
    if best["state"] is not None:
        target.load_state_dict(best["state"])
        result.best_val_loss = round(best["loss"], 4)
        result.best_step = best["step"]
        log(f"[target] kept the weights after step {best['step']} "
            f"(val {best['loss']:.4f})")
    target.eval()
    return result


@torch.no_grad()
def eval_target_loss(target, tokens: torch.Tensor, seq_len: int, batches: int, batch: int,
                     aux_ids: list[int], device: torch.device) -> float:
    """Mean next-token CE (nats/byte) over fixed, evenly spaced windows of a split."""
    n = tokens.numel() - seq_len - 1
    count = batches * batch
    starts = torch.linspace(0, max(n, 0), count).long().tolist()
    total = 0.0
    for b in range(batches):
        w = torch.stack([tokens[s:s + seq_len + 1] for s in starts[b * batch:(b + 1) * batch]])
        w = w.to(device)
        logits, _ = models.target_forward(target, w[:, :-1], aux_ids)
        total += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1)).item()
    return total / batches


def train_head(head, target, train_tokens: torch.Tensor, cfg: LoopConfig, ttt_k: int,
               head_config: dict, aux_ids: list[int], device: torch.device, seed: int,
               log: Callable[[str], None], val_tokens: torch.Tensor | None = None) -> LoopResult:
    """TTT training: the target is frozen and supplies aux features and soft labels on the fly."""
    gen = torch.Generator().manual_seed(seed)
    shape = models.head_attn_shape(head_config)
    embed = models.target_embedding(target)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    head.train()

    def step_fn(step: int):
        w = sample_windows(train_tokens, cfg.batch, cfg.seq_len, gen).to(device)
        with torch.no_grad():
            logits, aux = models.target_forward(target, w, aux_ids)
        draft_logits = ttt_unroll(head, embed, aux, w, ttt_k, shape)
        res = ttt_loss(draft_logits, logits, head.d2t, head.t2d)
        return res.total, {"acc": "/".join(f"{a:.2f}" for a in res.acc)}

    val_gen = torch.Generator().manual_seed(seed + 1000)
    val_batch = (sample_windows(val_tokens, cfg.batch, cfg.seq_len, val_gen)
                 if val_tokens is not None else None)

    @torch.no_grad()
    def eval_fn(done: int) -> dict:
        if val_batch is None:
            return {}
        head.eval()
        w = val_batch.to(device)
        logits, aux = models.target_forward(target, w, aux_ids)
        res = ttt_loss(ttt_unroll(head, embed, aux, w, ttt_k, shape), logits, head.d2t, head.t2d)
        head.train()
        return {"val_acc": "/".join(f"{a:.2f}" for a in res.acc)}

    trainable = [p for p in head.parameters() if p.requires_grad]
    result = _run_loop(trainable, cfg, step_fn, device, f"head K={ttt_k}", log, eval_fn)
    head.eval()
    return result
