"""Trace analyser benchmark: seconds and peak memory per 100 MB of trace, side by side.

Generates a synthetic SGLang-shaped GPU trace (kineto's layout and argument sets: scheduler spans,
`draft` / `step[VERIFY]` / `draft_extend`, cudaGraphLaunch with ~300 kernels per iteration of which
~30 % NCCL, eager launches, ac2g flow events, cpu_ops with record_shapes arguments) of about
--mb MB of JSON per rank, gzip'd as SGLang writes it. Then, each in a fresh child process
(peak RSS above the bare interpreter with the same imports):

  ours      probes.trace_analysis.analyze_paths (streaming)
  json      json.load of the whole file, the non-streaming baseline (parse only, no analysis)
  hta       HolisticTraceAnalysis: load + temporal breakdown (only with --hta; pass
            --hta-python to use an interpreter where it is installed)

With --traces DIR the same comparison runs on real rank files instead (e.g. a capture made on GPUs:
`specdecode-tune record --capture-trace-every` keeps them; extract them with --from-recording).

Usage: python benchmarks/analyzer_bench.py [--mb 100] [--ranks 1] [--eager] [--hta] [--hta-python PY] [--keep DIR] [--repeat N]
       python benchmarks/analyzer_bench.py --traces DIR [--hta --hta-python PY] [--repeat 3]
       python benchmarks/analyzer_bench.py --from-recording REC.sqlite --traces DIR   (writes the largest capture's files)
Prints one line per tool (the median of --repeat interleaved runs) and the ratios against ours.
Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------
# Synthetic trace

LAYERS_TARGET = 32
LAYERS_DRAFT = 1


def _kernel(name, ts, dur, corr, ext):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": round(ts, 3), "dur": round(dur, 3),
            "args": {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": 7,
                     "correlation": corr, "registers per thread": 128, "shared memory": 49152,
                     "blocks per SM": 0.79, "warps per SM": 3.16, "grid": [132, 1, 1], "block": [128, 1, 1],
                     "est. achieved occupancy %": 6}}


def _cpu(name, cat, ts, dur, ext, tid=4242, **extra):
    args = {"External id": ext, "Record function id": 0, "Ev Idx": ext}
    args.update(extra)
    return {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": tid, "ts": round(ts, 3),
            "dur": round(dur, 3), "args": args}


def _graph_kernels(layers: int, per_layer: int):
    names = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "flash_fwd_splitkv_kernel",
             "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>",
             "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "void at::native::elementwise_kernel<128, 2>", "act_and_mul_kernel"]
    for _ in range(layers):
        for j in range(per_layer):
            yield names[j % len(names)]


def iteration_events(i: int, base: float, corr: list[int], eager: bool = False):
    """One decode iteration, ~1 ms of CPU and GPU time starting at `base` (us). `eager`: every
    kernel has its own cudaLaunchKernel and flow pair (SGLang with --disable-cuda-graph)."""
    ev = []
    t = base

    def runtime(name, ts):
        corr[0] += 1
        c = corr[0]
        ev.append(_cpu(name, "cuda_runtime", ts, 6.0 if name != "cudaLaunchKernel" else 0.7, c,
                       cbid=211 if name == "cudaLaunchKernel" else 311, correlation=c))
        ev.append({"ph": "s", "id": c, "pid": 4242, "tid": 4242, "ts": round(ts, 3), "cat": "ac2g", "name": "ac2g"})
        return c

    def launch(name, ts, kernels, gpu_t):
        c = runtime(name, ts)
        for k, name_k in enumerate(kernels):
            if eager and k > 0:
                c = runtime("cudaLaunchKernel", ts + 0.8 * k)
            dur = 9.0 if name_k.startswith("nccl") else 3.0
            ev.append(_kernel(name_k, gpu_t, dur, c, c))
            if k == 0 or eager:
                ev.append({"ph": "f", "id": c, "pid": 0, "tid": 7, "ts": round(gpu_t, 3), "cat": "ac2g",
                           "name": "ac2g", "bp": "e"})
            gpu_t += dur + 0.5
        return gpu_t

    def ops(ts, n, ext):
        for k in range(n):
            ev.append(_cpu("aten::index_select", "cpu_op", ts + 3 * k, 2.0, ext + k,
                           **{"Input Dims": [[4096, 128], [], [8]], "Input type": ["c10::BFloat16", "Scalar", "long int"],
                              "Input Strides": [[128, 1], [], [1]], "Concrete Inputs": ["", "0", ""]}))

    ev.append(_cpu(f"ProfilerStep#{i}", "user_annotation", t, 1000.0, i))
    ev.append(_cpu("scheduler.run_batch", "user_annotation", t + 1, 998.0, i))
    gpu = t + 50
    ev.append(_cpu("draft", "user_annotation", t + 10, 200.0, i))
    ops(t + 12, 20, corr[0] * 10)
    gpu = launch("cudaGraphLaunch", t + 100, list(_graph_kernels(3, 6)), gpu)
    ops(t + 300, 8, corr[0] * 10)
    gpu = launch("cudaLaunchKernel", t + 330, ["eagle_prepare_for_verify_kernel"], gpu)
    ev.append(_cpu("step[VERIFY bs=8]", "user_annotation", t + 350, 300.0, i))
    ops(t + 352, 30, corr[0] * 10)
    gpu = launch("cudaGraphLaunch", t + 450, list(_graph_kernels(LAYERS_TARGET, 7)), gpu)
    for k in range(6):
        gpu = launch("cudaLaunchKernel", t + 660 + 10 * k, ["eagle_sample_kernel"], gpu)
    ev.append(_cpu("draft_extend", "user_annotation", t + 740, 200.0, i))
    ops(t + 742, 12, corr[0] * 10)
    gpu = launch("cudaGraphLaunch", t + 800, list(_graph_kernels(2, 6)), gpu)
    return ev


def write_synthetic_trace(path: Path, target_mb: float, rank: int = 0, eager: bool = False) -> tuple[int, int]:
    """Write a gzip'd trace of about target_mb MB of JSON; return (json bytes, iterations)."""
    target = int(target_mb * 1e6)
    written = 0
    corr = [0]
    i = 0
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],\n'
                f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": 8}},\n'
                '  "traceEvents": [\n')
        f.write(head)
        written += len(head)
        first = True
        while written < target:
            for e in iteration_events(i, 1_000_000.0 + 1200.0 * i, corr, eager):
                s = ("" if first else ",\n") + json.dumps(e, indent=1)
                first = False
                f.write(s)
                written += len(s)
            i += 1
        tail = '\n  ],\n  "traceName": "synthetic"\n}\n'
        f.write(tail)
        written += len(tail)
    return written, i


# ------------------------------------------------------------------------------------------------
# Measurement in children

CHILD = r"""
import json, resource, sys, time
mode, paths = sys.argv[1], sys.argv[2:]
if mode == "ours":
    from probes.trace_analysis import analyze_paths
    from pathlib import Path
elif mode == "json":
    import gzip
elif mode == "hta":
    from hta.trace_analysis import TraceAnalysis
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
summary = {}
if mode == "ours":
    d = analyze_paths([Path(p) for p in paths]).to_dict()
    r = d["ranks"][0]["total"]
    summary = {"iterations": len(d["ranks"][0]["iterations"]), "busy_ms": r["busy_ms"], "idle_ms": r["idle_ms"],
               "comm_ms": r["comm_ms"]}
elif mode == "json":
    for p in paths:
        with gzip.open(p, "rt") as f:
            summary["events"] = len(json.load(f)["traceEvents"])
elif mode == "hta":
    import os
    a = TraceAnalysis(trace_dir=os.path.dirname(paths[0]))
    tb = a.get_temporal_breakdown(visualize=False)
    row = tb.iloc[0].to_dict()
    summary = {k: (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in row.items()}
secs = time.perf_counter() - t0
# HTA parses rank files in worker processes: the largest of them counts too.
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"seconds": secs, "peak_mb": peak / 1024, "base_mb": base / 1024, "summary": summary}))
"""


def measure(python: str, mode: str, paths: list[Path]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([python, "-c", CHILD, mode, *map(str, paths)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="MB of JSON per rank file (default 100)")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--eager", action="store_true",
                    help="one launch and flow pair per kernel (no CUDA graphs): the most the analyser keeps")
    ap.add_argument("--hta", action="store_true", help="also run HolisticTraceAnalysis on the same files")
    ap.add_argument("--hta-python", default=sys.executable, help="interpreter with HolisticTraceAnalysis installed")
    ap.add_argument("--no-json", action="store_true", help="skip the json.load baseline")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every tool N times, interleaved, and compare the medians (default 1)")
    ap.add_argument("--keep", type=Path, help="write the traces here and keep them")
    ap.add_argument("--traces", type=Path, help="measure these real rank files (*.trace.json.gz in DIR) instead")
    ap.add_argument("--from-recording", type=Path, help="first write the largest capture of this recording into --traces")
    args = ap.parse_args()

    if args.from_recording:
        if not args.traces:
            ap.error("--from-recording needs --traces DIR")
        extract_capture(args.from_recording, args.traces)
    if args.traces:
        paths = sorted(args.traces.glob("*.trace.json*"))
        if not paths:
            print(f"analyzer_bench: no *.trace.json[.gz] in {args.traces}", file=sys.stderr)
            return 2
        total = sum(_json_bytes(p) for p in paths)
        print(f"trace: {len(paths)} real rank file(s) in {args.traces}, {total / 1e6:.1f} MB JSON "
              f"({sum(p.stat().st_size for p in paths) / 1e6:.1f} MB on disk)")
        return compare(args, paths, total)
    tmp = None
    if args.keep:
        d = args.keep
        d.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory()
        d = Path(tmp.name)
    paths, total = [], 0
    for r in range(args.ranks):
        p = d / f"synthetic-TP-{r}.trace.json.gz"
        size, iters = write_synthetic_trace(p, args.mb, r, args.eager)
        total += size
        paths.append(p)
    gz = sum(p.stat().st_size for p in paths)
    print(f"trace: {args.ranks} rank file(s), {total / 1e6:.1f} MB JSON ({gz / 1e6:.1f} MB gzip), "
          f"{iters} iterations per rank, {'eager launches' if args.eager else 'CUDA graph launches'}")
    try:
        return compare(args, paths, total)
    finally:
        if tmp:
            tmp.cleanup()


def _json_bytes(p: Path) -> int:
    with (gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")) as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 20), b""))


def extract_capture(rec: Path, dest: Path) -> None:
    """Write the rank files of the recording's largest trace capture into `dest`."""
    import sqlite3

    dest.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(f"file:{rec}?mode=ro", uri=True)
    best = con.execute("SELECT trace_id FROM traces GROUP BY trace_id ORDER BY SUM(LENGTH(data)) DESC LIMIT 1").fetchone()
    if best is None:
        raise SystemExit(f"analyzer_bench: {rec} holds no trace capture")
    for name, data in con.execute("SELECT name, data FROM traces WHERE trace_id = ? ORDER BY rank", best):
        (dest / name).write_bytes(data)
    con.close()


def compare(args, paths: list[Path], total: int) -> int:
    import statistics

    per100 = 100e6 / total
    modes = ["ours"] + ([] if args.no_json else ["json"]) + (["hta"] if args.hta else [])
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(max(1, args.repeat)):
        for mode in modes:     # interleaved, so a busy moment on the machine hits every tool alike
            runs[mode].append(measure(args.hta_python if mode == "hta" else sys.executable, mode, paths))
    results = {}
    for mode in modes:
        ok = [r for r in runs[mode] if "error" not in r]
        if not ok:
            print(f"{mode:>5}: failed: {runs[mode][0]['error']}")
            results[mode] = runs[mode][0]
            continue
        secs = [r["seconds"] for r in ok]
        res = dict(ok[0], seconds=statistics.median(secs),
                   peak_mb=statistics.median(r["peak_mb"] for r in ok), base_mb=statistics.median(r["base_mb"] for r in ok))
        results[mode] = res
        used = res["peak_mb"] - res["base_mb"]
        runs_txt = ", ".join(f"{x:.2f}" for x in secs)
        print(f"{mode:>5}: {res['seconds'] * per100:7.2f} s per 100 MB   peak +{used * per100:7.1f} MB per 100 MB"
              f"   (median {res['seconds']:.2f} s of [{runs_txt}], +{used:.0f} MB)   {json.dumps(res['summary'])[:120]}")
    ours = results["ours"]
    if "error" not in ours:
        for mode, res in results.items():
            if mode != "ours" and "error" not in res:
                print(f"{mode} / ours: time x{res['seconds'] / ours['seconds']:.2f}, "
                      f"peak memory x{(res['peak_mb'] - res['base_mb']) / max(1.0, ours['peak_mb'] - ours['base_mb']):.1f} (ours counted as at least 1 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
