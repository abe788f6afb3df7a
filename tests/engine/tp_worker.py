"""A TP rank for test_tp.py: runs the target and the sharded head on fixed inputs over gloo and
returns the outputs and the communicator's counts (imported by spawned children)."""

from __future__ import annotations

import datetime


def run(rank: int, world: int, port: int, out_q) -> None:
    import torch
    import torch.distributed as dist

    from refengine import presets
    from refengine.comm import Communicator
    from refengine.models.layers import causal_meta
    from refengine.tp import apply_tp_head, apply_tp_target

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    comm = Communicator(rank, world)
    target = presets.build_target("tiny", seed=3).double()
    head = presets.build_head("tiny-eagle3", seed=3).double()
    apply_tp_target(target, comm)
    apply_tp_head(head, comm)
    head.set_embed(target.model.embed_tokens)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    meta = causal_meta(torch.arange(2), torch.arange(12).expand(2, 12), 16)
    with torch.no_grad():
        comm.phase = "verify"
        hidden, aux = target(ids, meta, target.make_kv(2, 16, torch.float64, "cpu"))
        logits = target.logits(hidden)
        comm.phase = "draft"
        dlogits, dhidden = head(ids, aux, meta, head.make_kv(2, 16, torch.float64, "cpu"))
    _, calls, nbytes = comm.drain()
    # numpy, not tensors: torch would share tensors through this process's memory, gone at exit.
    arrays = [t.numpy() for t in (logits, aux, dlogits, dhidden)]
    out_q.put((rank, *arrays, calls, dict(comm.totals.by_op), nbytes))
    dist.destroy_process_group()
