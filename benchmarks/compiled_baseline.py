"""A gpt-fast-style Llama decoder: the anchor the engine's batch-1 decode is measured against.

What a user writes in 100 lines when they want a fast single-stream decoder (pytorch-labs/gpt-fast
`generate.py` and `model.py`, reduced to Llama-3 with greedy decoding): a static KV cache per
layer [1, Hkv, S, D] written by index, SDPA with GQA over the whole cache and a boolean causal
mask row, q/k/v and gate/up as one matmul each, and the one-token decode step under
`torch.compile(mode="reduce-overhead", fullgraph=True)` (Inductor plus its own CUDA graphs), with
the math SDPA backend in the decode step as gpt-fast does (Inductor then fuses it). Prefill runs
once, uncompiled.

Weights are taken from the engine's own model object (same preset, same seed), so both decode the
same function: `decode_roofline.py` checks the first greedy tokens agree in float32.
Must not import the engine's layers or kernels: it is the outside anchor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, layer, max_seq: int, dtype: torch.dtype, device, batch: int = 1):
        super().__init__()
        a, m = layer.self_attn, layer.mlp
        self.head_dim = a.head_dim
        self.n_head = a.q_proj.weight.shape[0] // a.head_dim
        self.n_kv = a.k_proj.weight.shape[0] // a.head_dim
        cat = lambda *ws: nn.Parameter(torch.cat([w.detach() for w in ws]).to(device, dtype), requires_grad=False)
        self.wqkv = cat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)
        self.wo = cat(a.o_proj.weight)
        self.w13 = cat(m.gate_proj.weight, m.up_proj.weight)
        self.w2 = cat(m.down_proj.weight)
        self.attn_norm = cat(layer.input_layernorm.weight)
        self.ffn_norm = cat(layer.post_attention_layernorm.weight)
        self.eps = layer.input_layernorm.eps
        shape = (batch, self.n_kv, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device))

    def forward(self, x, cos, sin, mask, input_pos):
        b, t, _ = x.shape
        h = F.rms_norm(x, self.attn_norm.shape, self.attn_norm, self.eps)
        kv = self.n_kv * self.head_dim
        q, k, v = (h @ self.wqkv.t()).split([self.n_head * self.head_dim, kv, kv], dim=-1)
        q = rope(q.view(b, t, self.n_head, self.head_dim), cos, sin).transpose(1, 2)
        k = rope(k.view(b, t, self.n_kv, self.head_dim), cos, sin).transpose(1, 2)
        v = v.view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        x = x + y.transpose(1, 2).reshape(b, t, -1) @ self.wo.t()
        h = F.rms_norm(x, self.ffn_norm.shape, self.ffn_norm, self.eps)
        gate, up = (h @ self.w13.t()).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ self.w2.t()


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Decoder(nn.Module):
    """The gpt-fast-style model over the weights of a refengine LlamaForCausalLM (read-only use).
    `batch` rows share positions (benchmarks/batch_cost.py times a batch's forward with it)."""

    def __init__(self, target, max_seq: int, dtype: torch.dtype, device, batch: int = 1):
        super().__init__()
        p = lambda w: nn.Parameter(w.detach().to(device, dtype), requires_grad=False)
        self.embed = p(target.model.embed_tokens.weight)
        self.layers = nn.ModuleList(Block(layer, max_seq, dtype, device, batch) for layer in target.model.layers)
        self.norm = p(target.model.norm.weight)
        self.eps = target.model.norm.eps
        self.lm_head = p(target.lm_head.weight)
        inv = target.model.rotary.inv_freq.detach().to(device, torch.float32)
        freqs = torch.arange(max_seq, device=device, dtype=torch.float32)[:, None] * inv[None]
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos().to(dtype))
        self.register_buffer("sin", emb.sin().to(dtype))
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=device)))

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        mask = self.causal[None, None, input_pos]
        cos, sin = self.cos[input_pos][None, :, None], self.sin[input_pos][None, :, None]
        x = F.embedding(idx, self.embed)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        return F.rms_norm(x, self.norm.shape, self.norm, self.eps) @ self.lm_head.t()


def decode_one_token(model: Decoder, cur: torch.Tensor, input_pos: torch.Tensor):
    logits = model(cur, input_pos)
    return logits[:, -1].argmax(-1, keepdim=True)


class Generator:
    """prefill (eager) + n greedy decode steps, the step compiled as gpt-fast compiles it."""

    def __init__(self, model: Decoder, compile: bool = True):
        self.model = model
        self.step = (torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
                     if compile else decode_one_token)

    @torch.no_grad()
    def generate(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        """-> (n new tokens, seconds of the decode loop alone, synchronised at both ends)."""
        dev = self.model.embed.device
        ids = torch.tensor([prompt], device=dev)
        pos = torch.arange(len(prompt), device=dev)
        cur = self.model(ids, pos)[:, -1].argmax(-1, keepdim=True)
        out = [cur]
        input_pos = torch.tensor([len(prompt)], device=dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        import time
        t0 = time.perf_counter()
        for _ in range(n - 1):
            # gpt-fast's decode: the math SDPA backend, which Inductor decomposes and fuses.
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                cur = self.step(self.model, cur, input_pos).clone()
            out.append(cur)
            input_pos += 1
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return torch.cat(out, 1)[0].tolist(), time.perf_counter() - t0
