"""The CUDA kernel behind `refengine::attend` (refengine.models.attend): GQA attention that reads
K/V straight from the pool rows, with the boolean mask of any forward (causal chain, tree, padded
graph row), split over the context so a batch-1 decode still fills the GPU.

One program per (request, KV head, context split, block of query rows); a query row is one
(token, query head of this KV head's group), so the group's queries share each K/V load. Online
softmax in float32 (flash-attention's recurrence); with more than one split a second small kernel
combines the partial (max, sum, acc) of each row. float32 inputs use IEEE dot products (no TF32),
so float32 runs stay comparable with the torch reference bit for bit up to summation order.
Imported only on CUDA hosts; must not be imported where Triton is missing (attend.py guards it).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from refengine.config import ATTEND_SKIP_HIDDEN_ENV

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def supports_shape(head_dim: int, dtype: torch.dtype) -> bool:
    return dtype in _DTYPES and 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (q.is_cuda and supports_shape(q.shape[-1], q.dtype) and k_cache.dtype == q.dtype
            and q.stride(-1) == 1 and k_cache.stride(-1) == 1)


@triton.jit
def _attend_part(Q, K, V, Rows, Mask, Limit, Out, Part, PartML,
                 sqb, sqt, sqh, skr, sks, skh, svr, svs, svh, smb, smt, sob, sot, soh,
                 T, C, MB, scale,
                 G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, IEEE: tl.constexpr, SKIP: tl.constexpr,
                 LIMIT: tl.constexpr):
    pid = tl.program_id(0)                 # request * HKV + kv head
    split = tl.program_id(1)
    mblk = tl.program_id(2)
    b = pid // HKV
    h = pid % HKV
    m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    t = m // G
    head = h * G + m % G
    valid_m = t < T
    d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + t[:, None] * sqt + head[:, None] * sqh + d[None, :], mask=valid_m[:, None], other=0.0)
    row = tl.load(Rows + b)
    # The columns to walk: the whole context bucket, or only up to the request's limit (no query
    # of it sees further), shared out between the splits so none of them idles.
    live = C
    if LIMIT:
        live = tl.minimum(tl.load(Limit + b), C)
    per = tl.cdiv(tl.cdiv(live, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per
    hi = tl.minimum(lo + per, live)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        valid_n = n < hi
        vis = tl.load(Mask + b * smb + t[:, None] * smt + n[None, :],
                      mask=valid_m[:, None] & valid_n[None, :], other=0)
        kv_n = valid_n
        if SKIP:
            # Columns no query row of this block sees (past the rows' ends inside a graph's context
            # bucket, other branches of a tree) are not read: predicated-off loads fetch nothing.
            kv_n = valid_n & (tl.max(vis, 0) != 0)
        k = tl.load(K + row * skr + n[:, None] * sks + h * skh + d[None, :], mask=kv_n[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale
        s = tl.where(vis != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + row * svr + n[:, None] * svs + h * svh + d[None, :], mask=kv_n[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(Out + b * sob + t[:, None] * sot + head[:, None] * soh + d[None, :],
                 out.to(Out.dtype.element_ty), mask=valid_m[:, None])
    else:
        base = (pid * SPLITS + split) * MB + mblk
        r = tl.arange(0, BLOCK_M)
        tl.store(Part + base * BLOCK_M * D + r[:, None] * D + d[None, :], acc)
        tl.store(PartML + base * 2 * BLOCK_M + r, m_i)
        tl.store(PartML + base * 2 * BLOCK_M + BLOCK_M + r, l_i)


@triton.jit
def _attend_combine(Part, PartML, Out, sob, sot, soh, T, MB,
                    G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                    SPLITS: tl.constexpr):
    pid = tl.program_id(0)
    mblk = tl.program_id(1)
    b = pid // HKV
    h = pid % HKV
    r = tl.arange(0, BLOCK_M)
    m = mblk * BLOCK_M + r
    t = m // G
    head = h * G + m % G
    valid_m = t < T
    d = tl.arange(0, D)
    m_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        base = (pid * SPLITS + s) * MB + mblk
        m_max = tl.maximum(m_max, tl.load(PartML + base * 2 * BLOCK_M + r))
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for s in tl.static_range(SPLITS):
        base = (pid * SPLITS + s) * MB + mblk
        w = tl.exp(tl.load(PartML + base * 2 * BLOCK_M + r) - m_safe)
        l_sum += w * tl.load(PartML + base * 2 * BLOCK_M + BLOCK_M + r)
        acc += w[:, None] * tl.load(Part + base * BLOCK_M * D + r[:, None] * D + d[None, :])
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(Out + b * sob + t[:, None] * sot + head[:, None] * soh + d[None, :],
             out.to(Out.dtype.element_ty), mask=valid_m[:, None])


def plan(b: int, t: int, hq: int, hk: int, c: int, d: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, blocks of query rows, BLOCK_N, context splits) for one call's shapes.

    Few programs (a small batch): split the context until the programs cover the SMs twice, each
    split at least one BLOCK_N. A decode or verify batch (one block of at most 16 query rows per KV
    head) whose programs cover the SMs once: no split and 32-column blocks. Measured on an H200 at
    the 8B's heads (benchmarks/results/attend_sweep_h200.md): at 32 rows × 4 tokens the old rule's
    2 splits took 39.2 µs against 25.7 µs unsplit; at 64 rows, 32-column blocks took 38.1 µs against
    48.5 µs with 64. Prefill-sized blocks keep the old rule (not measured)."""
    rows = (hq // hk) * t
    block_m = max(16, min(64, triton.next_power_of_2(rows)))
    mb = triton.cdiv(rows, block_m)
    programs = b * hk * mb
    if block_m == 16 and programs >= sms:
        return block_m, mb, 32, 1
    block_n = 64 if d <= 128 else 32
    n_blocks = triton.cdiv(c, block_n)
    want = triton.cdiv(2 * sms, programs)
    return block_m, mb, block_n, max(1, min(16, n_blocks, want))


_SMS: dict[int, int] = {}
# Off: on an H200 it made the engine's attention slower (1127 -> 1300 µs a forward at 64 rows × 1
# token, benchmarks/results/fused_kernels_h200.md): each K/V load waits for the mask's, which cost
# more than the skipped bytes saved. SPECDECODE_ATTEND_SKIP_HIDDEN=1 turns it on in a whole engine
# (a benchmark's side-by-side run, after a change to the kernel).
SKIP_HIDDEN = os.environ.get(ATTEND_SKIP_HIDDEN_ENV, "") == "1"


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
           mask: torch.Tensor, scale: float, *, block_n: int | None = None, splits: int | None = None,
           num_warps: int = 4, num_stages: int | None = None, skip_hidden: bool | None = None,
           limit: torch.Tensor | None = None) -> torch.Tensor:
    """The op's CUDA implementation. limit: [B] int32, attend.visible_limit(mask) (columns at or
    past limit[b] are not read), or None (the whole bucket). The other keyword arguments override
    plan()'s choice (for benchmarks/attend_sweep.py, which measures the alternatives); the engine
    passes none. skip_hidden: read no K/V for columns that no query row of a block sees; None:
    SKIP_HIDDEN."""
    skip_hidden = SKIP_HIDDEN if skip_hidden is None else skip_hidden
    b, t, hq, d = q.shape
    hk = k_cache.shape[2]
    c = mask.shape[-1]
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if dev not in _SMS:
        _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    block_m, mb, planned_n, planned_splits = plan(b, t, hq, hk, c, d, _SMS[dev])
    block_n = block_n or planned_n
    splits = max(1, min(splits or planned_splits, triton.cdiv(c, block_n)))
    stages = {} if num_stages is None else {"num_stages": num_stages}
    out = q.new_empty(q.shape)
    m8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    if splits > 1:
        part = torch.empty(b * hk * splits * mb * block_m * d, dtype=torch.float32, device=q.device)
        ml = torch.empty(b * hk * splits * mb * 2 * block_m, dtype=torch.float32, device=q.device)
    else:
        part = ml = out
    _attend_part[(b * hk, splits, mb)](
        q, k_cache, v_cache, rows, m8, rows if limit is None else limit, out, part, ml,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), m8.stride(0), m8.stride(1),
        out.stride(0), out.stride(1), out.stride(2), t, c, mb, scale,
        G=hq // hk, HKV=hk, D=d, BLOCK_M=block_m, BLOCK_N=block_n, SPLITS=splits,
        IEEE=q.dtype == torch.float32, SKIP=skip_hidden, LIMIT=limit is not None, num_warps=num_warps, **stages)
    if splits > 1:
        _attend_combine[(b * hk, mb)](part, ml, out, out.stride(0), out.stride(1), out.stride(2), t, mb,
                                      G=hq // hk, HKV=hk, D=d, BLOCK_M=block_m, SPLITS=splits, num_warps=4)
    return out
