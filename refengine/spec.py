"""The speculative steps of one decode iteration, as short tensor functions (gpt-fast style).

Alignment (EAGLE-3 §2.1): draft position p holds (target feature g_p, embedding of x_{p+1}) and
predicts x_{p+2}. With seq_len = n committed tokens in the target KV and the root x_n (the last
bonus) not yet in it:
  draft:        step 1's token d1 comes from the previous extend; step i >= 2 feeds d_{i-1} at
                position n + i - 2 with the draft's own previous pre-norm output as hidden;
  verify:       the target runs [x_n, d1..ds] at positions n..n+s;
  verify_sample: walk the tree (a chain is a tree) from the root, accepting the child equal to
                the target's argmax (or, sampling, by SGLang's target-only rule); bonus = the
                target's choice at the last accepted node (τ = accepted + 1);
  draft_extend: the draft re-runs N rows per request (SGLang spec-v2): ids = the target's
                predictions [d1..dj, bonus, garbage...], hidden = target aux of [x_n, d1..],
                positions n..n+N-1; row j's output seeds the next cycle. Rows past j write draft
                KV beyond the committed length, which nothing can see and the next cycle overwrites.
Functions take fixed-shape tensors and return tensors; bookkeeping is refengine.engine's.
"""

from __future__ import annotations

import torch

from refengine.models.eagle3 import Eagle3Head
from refengine.models.layers import AttnMeta, KVPool, causal_meta


def draft_chain(head: Eagle3Head, kv: KVPool, rows: torch.Tensor, seq_lens: torch.Tensor,
                first: torch.Tensor, hidden: torch.Tensor, steps: int, ctx: int) -> torch.Tensor:
    """Greedy chain of `steps` draft tokens (target ids) per request: [B, steps].

    Only steps - 1 draft forwards run: the first token came from the previous extend. The engine
    runs refengine.graphs.graphed_chain in every graph mode; this plain loop is the reference the
    tests check it against.
    """
    tokens = [first]
    h = hidden[:, None]
    for i in range(1, steps):
        positions = (seq_lens + i - 1)[:, None]
        logits, h = head(tokens[-1][:, None], h, causal_meta(rows, positions, ctx), kv)
        tokens.append(head.to_target_ids(logits[:, -1].argmax(-1)))
    return torch.stack(tokens, dim=1)


def draft_chain_sample(head: Eagle3Head, kv: KVPool, rows: torch.Tensor, seq_lens: torch.Tensor,
                       first_logits: torch.Tensor, hidden: torch.Tensor, steps: int, ctx: int,
                       temperature: torch.Tensor, coins: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain *sampled* from q = softmax(draft logits / T) (rejection-sampling mode, topk = 1),
    returning the drafts [B, s] and q over the target vocabulary [B, s, V] for the verifier.
    Rows with T = 0 take the argmax (q one-hot)."""
    b = rows.shape[0]
    hot = torch.arange(first_logits.shape[-1], device=rows.device)
    hot = hot + head.d2t[hot]
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)

    def pick(logits, i):
        q_d = torch.softmax(logits.float() / t[:, None].float(), -1)
        q_d = torch.where(greedy[:, None], torch.nn.functional.one_hot(logits.argmax(-1), q_d.shape[-1]).float(), q_d)
        d = sample_from(q_d, coins[:, i])
        q_t = torch.zeros(b, vocab, dtype=q_d.dtype, device=rows.device).scatter_(1, hot.expand(b, -1), q_d)
        return hot[d], q_t

    tok, q = pick(first_logits, 0)
    tokens, qs = [tok], [q]
    h = hidden[:, None]
    for i in range(1, steps):
        positions = (seq_lens + i - 1)[:, None]
        logits, h = head(tokens[-1][:, None], h, causal_meta(rows, positions, ctx), kv)
        tok, q = pick(logits[:, -1], i)
        tokens.append(tok)
        qs.append(q)
    return torch.stack(tokens, 1), torch.stack(qs, 1)


def draft_extend(head: Eagle3Head, kv: KVPool, rows: torch.Tensor, start: torch.Tensor | None,
                 ids: torch.Tensor, aux: torch.Tensor, select: torch.Tensor,
                 ctx: int, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the draft over [B, T] rows at positions start..start+T-1 (or the given [B, T]
    `positions`: a prefill batch clamps its pad rows' inside the context) and read row `select` [B].

    Returns (pre-norm hidden [B, H], draft logits [B, draft_vocab]) at the selected row: the
    next cycle's first level (argmax for a chain, top-k for a tree, a sample under rejection
    sampling) and the hidden its next step is fed.
    """
    if positions is None:
        positions = start[:, None] + torch.arange(ids.shape[1], device=ids.device)[None]
    logits, out = head(ids, aux, causal_meta(rows, positions, ctx), kv)
    b = torch.arange(ids.shape[0], device=ids.device)
    return out[b, select], logits[b, select]


# -- trees (topk > 1) ---------------------------------------------------------------------------
#
# A draft tree is (tokens [B, N], parents [B, N], depth [B, N]) with node 0 the root (the bonus
# of the last cycle, parent -1) and parents preceding children. A chain is the tree with
# parents [-1, 0, 1, ...].

def chain_tree(root: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, s = drafts.shape
    idx = torch.arange(s + 1, device=drafts.device)
    parents = (idx - 1).expand(b, s + 1)
    return torch.cat([root[:, None], drafts], 1), parents.contiguous(), idx.expand(b, s + 1).contiguous()


def draft_tree(head: Eagle3Head, kv: KVPool, rows: torch.Tensor, seq_lens: torch.Tensor, root: torch.Tensor,
               first_logits: torch.Tensor, hidden: torch.Tensor, steps: int, topk: int, n_tokens: int,
               ctx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-2/3 dynamic tree as SGLang builds it (eagle3.md §2.2).

    Level 1 = top-k of the extend's draft distribution. Each of the steps - 1 draft forwards feeds
    the k expanded nodes (one position deeper each time), keeps all k² children as candidates
    scored by the product of probabilities along the path, and expands the best k of them. The
    best N - 1 candidates (ascending pool index, so parents precede children) become the tree.
    Expanded nodes write their draft K/V to scratch slots seq_len + (i - 1)·k + j, seen only by
    their descendants; the next extend overwrites them.
    """
    b, k, dev = rows.shape[0], topk, rows.device
    p1, t1 = torch.softmax(first_logits.float(), -1).topk(k, dim=-1)
    scores, tokens = [p1.double()], [head.to_target_ids(t1)]
    parents, depths = [torch.full((b, k), -1, device=dev)], [torch.ones(b, k, dtype=torch.long, device=dev)]
    exp_scores, exp_tokens = p1.double(), tokens[0]
    exp_pool = torch.arange(k, device=dev).expand(b, k)
    exp_hidden = hidden[:, None].expand(b, k, hidden.shape[-1])
    scratch = max(1, (steps - 1) * k)
    exp_anc = torch.zeros(b, k, scratch, dtype=torch.bool, device=dev)
    cols = torch.arange(ctx, device=dev)
    rel = cols[None] - seq_lens[:, None]                        # column relative to seq_len
    in_scratch = (rel >= 0) & (rel < scratch)
    rel_idx = rel.clamp(0, scratch - 1)
    pool = k
    for i in range(1, steps):
        own = (i - 1) * k + torch.arange(k, device=dev)
        exp_anc = exp_anc | torch.nn.functional.one_hot(own, scratch).bool()[None]
        visible = exp_anc.gather(2, rel_idx[:, None, :].expand(b, k, ctx)) & in_scratch[:, None, :]
        mask = (cols[None, None, :] < seq_lens[:, None, None]) | visible
        positions = (seq_lens + i - 1)[:, None].expand(b, k)
        slots = seq_lens[:, None] + own[None]
        logits, out = head(exp_tokens, exp_hidden, AttnMeta(rows, positions, slots, mask), kv)
        tp, ti = torch.softmax(logits.float(), -1).topk(k, dim=-1)   # [B, k, k]
        child_scores = (exp_scores[:, :, None] * tp.double()).reshape(b, k * k)
        child_tokens = head.to_target_ids(ti).reshape(b, k * k)
        scores.append(child_scores)
        tokens.append(child_tokens)
        parents.append(exp_pool[:, :, None].expand(b, k, k).reshape(b, k * k))
        depths.append(torch.full((b, k * k), i + 1, device=dev))
        exp_scores, sel = child_scores.topk(k, dim=-1)
        parent_row = sel // k
        exp_tokens = child_tokens.gather(1, sel)
        exp_pool = pool + sel
        exp_hidden = out.gather(1, parent_row[:, :, None].expand(b, k, out.shape[-1]))
        exp_anc = exp_anc.gather(1, parent_row[:, :, None].expand(b, k, scratch))
        pool += k * k
    all_scores, all_tokens = torch.cat(scores, 1), torch.cat(tokens, 1)
    all_parents, all_depths = torch.cat(parents, 1), torch.cat(depths, 1)
    # A child's score never exceeds its parent's; the tiny depth penalty breaks exact ties in the
    # parent's favour so a selected node's parent is always selected too.
    rank_scores = all_scores - all_depths.double() * 1e-12
    top = rank_scores.topk(n_tokens - 1, dim=-1).indices.sort(dim=-1).values
    node_of = torch.full((b, pool), -1, device=dev)
    node_of.scatter_(1, top, torch.arange(1, n_tokens, device=dev).expand(b, n_tokens - 1).contiguous())
    sel_parent = all_parents.gather(1, top)
    parent_node = torch.where(sel_parent < 0, torch.zeros_like(sel_parent),
                              node_of.gather(1, sel_parent.clamp(min=0)))
    tree_tokens = torch.cat([root[:, None], all_tokens.gather(1, top)], 1)
    tree_parents = torch.cat([torch.full((b, 1), -1, device=dev), parent_node], 1)
    tree_depth = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=dev), all_depths.gather(1, top)], 1)
    return tree_tokens, tree_parents, tree_depth


def tree_meta(rows: torch.Tensor, seq_lens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
              ctx: int, levels: int | None = None) -> AttnMeta:
    """Verify inputs for a tree: node i at position seq_len + depth(i), slot seq_len + i, seeing
    the committed prefix, its ancestors and itself (eagle3.md §2.3). levels: an upper bound on the
    depth known on the host (the draft's steps); without it the depth is read from the device."""
    b, n = parents.shape
    dev = parents.device
    eye = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n)
    par = parents.clamp(min=0)
    anc = eye.clone()
    if levels is None:
        levels = int(depth.max().item()) if depth.numel() else 0
    for _ in range(levels):   # extra rounds change nothing: the closure is already complete
        up = anc.gather(1, par[:, :, None].expand(b, n, n)) & (parents >= 0)[:, :, None]
        anc = anc | up
    cols = torch.arange(ctx, device=dev)
    rel = cols[None] - seq_lens[:, None]
    in_win = (rel >= 0) & (rel < n)
    window = anc.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(b, n, ctx)) & in_win[:, None, :]
    mask = (cols[None, None, :] < seq_lens[:, None, None]) | window
    positions = seq_lens[:, None] + depth
    slots = seq_lens[:, None] + torch.arange(n, device=dev)[None]
    return AttnMeta(rows, positions, slots, mask)


def verify_tree_greedy(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor,
                       steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Longest accepted path at temperature 0: at node c accept the child whose token is the
    target's argmax at c (children are distinct, so at most one).

    Returns (path [B, steps + 1] node ids, -1 padded; accepted [B]; bonus [B] = argmax at the
    last accepted node).
    """
    predict = logits.argmax(-1)
    return _walk(tokens, parents, steps, lambda cur: predict.gather(1, cur[:, None]), None)


def verify_chain_greedy(tokens: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """verify_tree_greedy for a chain (tokens [B, s+1] = root, d1..ds; node i's parent is i-1) in a
    fixed handful of kernels: d_i is accepted while every d_j, j <= i, equals the target's argmax
    at node j-1. The tree walk costs ~12 small ops per level, which on a GPU host is most of
    verify_sample; the result is the same."""
    predict = logits.argmax(-1)                                    # [B, s+1]
    accepted = (tokens[:, 1:] == predict[:, :-1]).long().cumprod(1).sum(1)
    return chain_path(accepted, tokens.shape[1]), accepted, predict.gather(1, accepted[:, None])[:, 0]


def chain_path(accepted: torch.Tensor, n: int) -> torch.Tensor:
    """Node ids 0..accepted of a chain, -1 after: [B, n]."""
    idx = torch.arange(n, device=accepted.device)[None]
    return torch.where(idx <= accepted[:, None], idx, torch.full_like(idx, -1))


def _walk(tokens, parents, steps, want_fn, accept_fn):
    """Walk from the root one level per step; a level accepts the first candidate child.
    Greedy: candidates are children whose token == want_fn(cur). Sampling: accept_fn decides.
    Returns (path, accepted, bonus) for greedy, (path, accepted, last node) for sampling."""
    b = tokens.shape[0]
    dev = tokens.device
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    path = torch.full((b, steps + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    active = torch.ones(b, dtype=torch.bool, device=dev)
    accepted = torch.zeros(b, dtype=torch.long, device=dev)
    for d in range(1, steps + 1):
        children = parents == cur[:, None]
        if accept_fn is None:
            cand = children & (tokens == want_fn(cur))
        else:
            cand = accept_fn(d, cur, children)
        has = cand.any(1) & active
        nxt = cand.to(torch.int8).argmax(1)
        cur = torch.where(has, nxt, cur)
        path[:, d] = torch.where(has, nxt, torch.full_like(nxt, -1))
        accepted += has.long()
        active &= has
    bonus = want_fn(cur)[:, 0] if accept_fn is None else None
    return path, accepted, bonus if bonus is not None else cur


def subtree_height(parents: torch.Tensor, steps: int) -> torch.Tensor:
    """Levels below each node down to its deepest descendant ([B, N]; leaves 0)."""
    height = torch.zeros_like(parents)
    par = parents.clamp(min=0)
    for _ in range(steps):
        up = torch.where(parents >= 0, height + 1, torch.zeros_like(height))
        height = height.scatter_reduce(1, par, up, reduce="amax")
    return height


def sampling_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, filtered: bool | None = None) -> torch.Tensor:
    """Target probabilities as SGLang samples them: logits / T, softmax, top-k then top-p
    renormalisation. Rows with T = 0 become one-hot at the argmax. Shapes [B, N, V] and [B].
    filtered: whether any row has top-k < V or top-p < 1, when the caller knows it from host-side
    values (otherwise it is read from the device: a sync that would stall an overlapped launch)."""
    lf = logits.double() if logits.dtype == torch.float64 else logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).to(lf.dtype)
    probs = torch.softmax(lf / t[:, None, None], -1)
    v = probs.shape[-1]
    k = torch.where((top_k <= 0) | (top_k > v), torch.full_like(top_k, v), top_k)
    if filtered is None:
        filtered = bool((k < v).any()) or bool((top_p < 1).any())
    if filtered:
        sp, si = probs.sort(-1, descending=True)
        ranks = torch.arange(v, device=probs.device)
        cum = sp.cumsum(-1) - sp                               # mass strictly before each token
        keep = (ranks[None, None, :] < k[:, None, None]) & (cum < top_p[:, None, None].to(sp.dtype))
        keep[..., 0] = True
        sp = sp * keep
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    onehot = torch.nn.functional.one_hot(lf.argmax(-1), v).to(probs.dtype)
    return torch.where(greedy[:, None, None], onehot, probs)


def sample_from(probs: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample from [B, V] probabilities (need not be normalised) with coins [B]."""
    cdf = probs.cumsum(-1)
    x = coin.to(cdf.dtype) * cdf[:, -1]
    return torch.searchsorted(cdf, x[:, None], right=True)[:, 0].clamp(max=probs.shape[-1] - 1)


def verify_tree_sample(tokens: torch.Tensor, parents: torch.Tensor, probs: torch.Tensor, coins: torch.Tensor,
                       steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's target-only tree sampling with thresholds 1.0 (lossless; eagle3.md §3.2).

    Draft tokens are deterministic proposals. At node c with one coin u per level, walk c's
    children in order accumulating p(child); accept the first child with u < accumulated mass.
    If none is accepted, the bonus is sampled from p at c with those children's mass removed; at
    a node without children, from p at c. Equivalent to sampling from p at every step.

    Args:
        probs: [B, N, V] from `sampling_probs`; coins: [B, steps + 1] uniform in [0, 1).
    """
    b, n = tokens.shape
    rows = torch.arange(b, device=tokens.device)

    def accept(d, cur, children):
        p_cur = probs[rows, cur]                                # [B, V]
        pc = p_cur.gather(1, tokens) * children                 # target mass of each child
        cum = pc.cumsum(1)
        return children & (coins[:, d - 1, None].to(cum.dtype) < cum)

    path, accepted, cur = _walk(tokens, parents, steps, None, accept)
    p_last = probs[rows, cur].clone()
    children = (parents == cur[:, None])
    removed = torch.zeros_like(p_last).scatter_(1, tokens, children.to(p_last.dtype))
    p_last = p_last * (1 - removed.clamp(max=1))
    # Zero mass left happens only for a one-hot (greedy) row whose argmax was a child: impossible,
    # since that child would have been accepted; guard anyway with the unmodified distribution.
    empty = p_last.sum(-1) <= 0
    p_last = torch.where(empty[:, None], probs[rows, cur], p_last)
    bonus = sample_from(p_last, coins[:, steps])
    return path, accepted, bonus


def verify_chain_rejection(drafts: torch.Tensor, q: torch.Tensor, probs: torch.Tensor,
                           coins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Classic speculative sampling (Leviathan et al.; SGLang --speculative-use-rejection-sampling):
    accept draft x_i ~ q_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
    sample from norm(max(0, p_i - q_i)); if all are accepted sample the bonus from p_s.

    Args:
        drafts [B, s]; q [B, s, V] draft distributions (target vocabulary); probs [B, s + 1, V];
        coins [B, s + 1].
    Returns:
        (accepted [B], bonus [B]).
    """
    b, s = drafts.shape
    rows = torch.arange(b, device=drafts.device)
    p_x = probs[:, :s].gather(2, drafts[:, :, None])[..., 0]
    q_x = q.gather(2, drafts[:, :, None])[..., 0].to(p_x.dtype)
    ok = coins[:, :s].to(p_x.dtype) < (p_x / q_x.clamp(min=1e-30))
    accepted = ok.to(torch.int32).cumprod(1).sum(1).long()
    j = accepted
    p_j = probs[rows, j]
    q_j = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows, j].to(p_j.dtype)
    resid = (p_j - q_j).clamp(min=0)
    resid = torch.where((j < s)[:, None] & (resid.sum(-1, keepdim=True) > 0), resid, p_j)
    bonus = sample_from(resid, coins[:, s])                     # a coin no acceptance test used
    return accepted, bonus
