"""SGLang plugin overhead per decode iteration on the host, side by side (CPU, no GPU needed).

Calls one stand-in decode iteration (the call order of SGLang 0.5.23's
EAGLEWorkerV2.forward_batch_generation: draft, verify with the target forward inside,
draft_extend, then the scheduler's on_verify_complete_cpu) many times, with the plugin's hook
functions wrapped around it the way SGLang's HookRegistry wraps them (AROUND), in three states:

  bare      no hooks
  off       hooks installed, no timer lease (what an unwatched server pays)
  on        hooks installed, lease held: events recorded, records resolved, stream file written
            (HostEvent here; on a GPU the events are torch.cuda.Event, whose record() costs more)

The stand-in iteration does no work, so the numbers are the hooks' own host cost in microseconds.
Usage: python benchmarks/sglang_plugin_overhead.py [--iterations 20000]
Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from types import SimpleNamespace

from probes.inserver import sglang_plugin as P


class Mode:
    def is_extend(self):
        return False


class Draft:
    speculative_num_steps = 3

    def draft(self, batch):
        return batch

    def _draft_extend_for_decode(self, batch, out, kv_loc_plan=None):
        return None


class Target:
    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False):
        return forward_batch


class Worker:
    topk, speculative_num_steps, speculative_num_draft_tokens, device = 1, 3, 4, "cpu"

    def __init__(self, verify, target_fwd, draft, extend, iteration, accepted):
        self.draft_worker, self.target = Draft(), Target()
        self._verify, self._target_fwd, self._draft, self._extend = verify, target_fwd, draft, extend
        self._iteration, self._accepted = iteration, accepted

    def forward_batch_generation(self, batch):
        return self._iteration(Worker._fbg, self, batch)

    @staticmethod
    def _fbg(self, batch):
        self._draft(Draft.draft, self.draft_worker, batch)
        self._verify(Worker._verify_body, self, batch)
        self._extend(Draft._draft_extend_for_decode, self.draft_worker, batch, None)

    @staticmethod
    def _verify_body(self, batch):
        return self._target_fwd(Target.forward_batch_generation, self.target, batch=None,
                                forward_batch=batch, is_verify=True)

    def on_verify_complete_cpu(self, accepted, batch_size=0):
        return self._accepted(lambda s, a, batch_size=0: None, self, accepted, batch_size=batch_size)


def _passthrough(original, *a, **k):
    return original(*a, **k)


def run(n: int, hooks: bool, lease: bool) -> float:
    P._probe = P._Probe()
    if lease:
        P._probe.lease.grant(3600, time.monotonic())
    if hooks:
        w = Worker(P.around_verify, P.around_target_forward, P.around_draft, P.around_draft_extend,
                   P.around_iteration, P.around_accepted)
    else:
        w = Worker(*([_passthrough] * 6))
    batch = SimpleNamespace(forward_mode=Mode(), is_extend_in_batch=False,
                            seq_lens=SimpleNamespace(shape=(4,)))
    acc = [2, 1, 3, 0]
    for _ in range(200):                     # warm-up (lazy set-up happens here)
        w.forward_batch_generation(batch)
        w.on_verify_complete_cpu(acc, batch_size=4)
    t0 = time.perf_counter()
    for _ in range(n):
        w.forward_batch_generation(batch)
        w.on_verify_complete_cpu(acc, batch_size=4)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        os.environ["SPECDECODE_STREAM_DIR"] = d
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        bare = run(args.iterations, hooks=False, lease=False)
        off = run(args.iterations, hooks=True, lease=False)
        on = run(args.iterations, hooks=True, lease=True)
    print(f"bare {bare:7.2f} us/iteration (stand-in iteration through pass-through wrappers)")
    print(f"off  {off:7.2f} us/iteration  (+{off - bare:.2f} us: hooks, no lease)")
    print(f"on   {on:7.2f} us/iteration  (+{on - bare:.2f} us: host events, records, stream file)")
    print(f"ratio off/bare {off / bare:.2f}   on/bare {on / bare:.2f}   "
          f"(an EAGLE-3 decode iteration on GPUs takes ~10,000-50,000 us)")


if __name__ == "__main__":
    main()
