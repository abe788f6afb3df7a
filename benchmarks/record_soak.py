"""Soak of the recording path: memory and file growth of a long recording, and what reporting it costs.

Part 1 (synthetic, no server): a feed at a live 8-GPU box's rate (server series at 4 Hz, 8 GPUs x
17 NVML series at 10 Hz, a 1 MB trace every 5 min) goes through the real Session (the bounded store
`record` uses + the Recorder) as fast as the machine allows, for `--minutes` of recording time. Every 10 recorded minutes it prints
the process RSS, the file size and the Recorder's backlog; at the end the write rate as a ratio to the
live rate (above 1 means the writer keeps up), then `report` (JSON) over the file: seconds and peak RSS.

Part 2 (real server): `specdecode-tune record --load 2` against `serve --tp-size 2` (CPU, the shipped
tiny model; started here unless --url is given) for `--seconds`, sampling the recorder process's RSS
and the file size every 5 s: bytes per recorded hour and RSS drift.

    python benchmarks/record_soak.py --minutes 120 --seconds 120 --json benchmarks/results/record_soak.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

from tuner.commands.record import record_store  # noqa: E402
from tuner.core import series as S  # noqa: E402
from tuner.core.clock import ManualClock  # noqa: E402
from tuner.core.records import Event, Sample, Trace  # noqa: E402
from tuner.core.session import Session  # noqa: E402
from tuner.engine_process import EngineProcess, EngineStartError  # noqa: E402
from tuner.recording import Recorder  # noqa: E402

SERVER_SERIES = ([S.SERVER_TOK_PER_S, S.SERVER_ITER_PER_S, S.SERVER_BATCH, S.SERVER_RUNNING, S.SERVER_QUEUED,
                  S.SPEC_ACCEPT_LEN, S.SPEC_ACCEPT_RATE, S.LOAD_TOK_PER_S, S.PHASE_WALL_MS, S.PHASE_IDLE_MS]
                 + [S.phase_ms(p) for p in S.PHASES] + [S.phase_comm_ms(p) for p in S.PHASES]
                 + [S.accept_pos(k) for k in range(1, 6)] + [S.accept_cond(k) for k in range(1, 6)])
GPU_METRICS = ("util_pct", "mem_util_pct", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct",
               "mem_used_mib", "mem_total_mib", "server_mem_mib", "power_w", "power_limit_w", "sm_clock_mhz",
               "temp_c", "pcie_rx_mbps", "pcie_tx_mbps", "nvlink_rx_mbps", "nvlink_tx_mbps")


def rss_mb(pid: int | str = "self") -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else math.nan


def file_mb(path: Path) -> float:
    return sum(os.path.getsize(str(path) + s) for s in ("", "-wal") if os.path.exists(str(path) + s)) / 1e6


# -- part 1 -------------------------------------------------------------------------------------------------

def synthetic(minutes: float, gpus: int, out: Path) -> dict:
    t0 = 1_800_000_000.0
    clock = ManualClock(t0)
    rec = Recorder(out, {"backend": "synthetic", "command": "benchmarks/record_soak.py"}, overwrite=True)
    session = Session(None, clock=clock, recorder=rec, store=record_store())   # as `record` builds it
    live_rate = len(SERVER_SERIES) * 4 + gpus * len(GPU_METRICS) * 10
    blob = os.urandom(1 << 20)                      # incompressible, like a gzip trace
    rows = []
    produced = 0
    start = time.perf_counter()
    rss0 = rss_mb()
    step = 0.25
    n_steps = int(minutes * 60 / step)
    for i in range(n_steps):
        t = t0 + i * step
        batch = [Sample(t, name, 100.0 + (i % 97)) for name in SERVER_SERIES]
        for tenth in (0.0, 0.1, 0.2) if i % 2 == 0 else (0.0, 0.1):
            batch += [Sample(t + tenth, f"gpu{g}/{m}", float(i % 89)) for g in range(gpus) for m in GPU_METRICS]
        if i % int(300 / step) == 0 and i:
            batch += [Trace(t, f"soak-{i}", r, f"soak-{i}-TP-{r}.trace.json.gz", blob, {"schema": 1} if r == 0 else None)
                      for r in range(2)]
            batch.append(Event(t, "trace_captured", {"trace_id": f"soak-{i}", "ranks": 2}))
        if i % int(60 / step) == 0:
            batch.append(Event(t, "config_changed", {"old": {}, "new": {"speculative_num_steps": 2 + i % 3},
                                                     "epoch": i, "source": "phase_stream"}))
        for r in batch:
            session.put(r)
        produced += len(batch)
        clock.set(t)
        session.tick()
        if i and i % int(60 / step) == 0:
            rec.flush(timeout=600)          # keep to the steady state, not a backlog of our own making
        if i and i % int(600 / step) == 0:
            rows.append({"recorded_min": round(i * step / 60), "rss_mb": round(rss_mb(), 1),
                         "file_mb": round(file_mb(out), 1), "backlog": produced - rec.written,
                         "wall_s": round(time.perf_counter() - start, 1)})
            print(f"  {rows[-1]['recorded_min']:4d} min recorded: RSS {rows[-1]['rss_mb']:7.1f} MB, file "
                  f"{rows[-1]['file_mb']:8.1f} MB, writer backlog {rows[-1]['backlog']:7d} records, "
                  f"{rows[-1]['wall_s']:6.1f} s", flush=True)
    session.close()
    wall = time.perf_counter() - start
    recorded_s = n_steps * step
    result = {"recorded_minutes": minutes, "gpus": gpus, "records": produced, "live_records_per_s": live_rate,
              "written_records_per_s": round(produced / wall), "keeps_up_ratio": round(produced / wall / live_rate, 1),
              "wall_s": round(wall, 1), "rss_start_mb": round(rss0, 1), "rss_end_mb": round(rss_mb(), 1),
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "file_mb": round(file_mb(out), 1),
              "file_mb_per_recorded_hour": round(file_mb(out) / (recorded_s / 3600), 1),
              "recorder_error": rec.error, "progress": rows}
    # Reporting the long file: a child process, so its peak RSS is its own.
    t = time.perf_counter()
    cmd = [sys.executable, "-c", "import re, sys; from tuner.cli import main; rc = main(sys.argv[1:]); "
           "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1), file=sys.stderr); "
           "sys.exit(rc)",
           "report", str(out), "--out", str(out.with_suffix(".json"))]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result["report_s"] = round(time.perf_counter() - t, 1)
    result["report_rc"] = p.returncode
    result["report_peak_rss_mb"] = round(int(p.stderr.strip().splitlines()[-1]) / 1024, 1) if p.returncode == 0 else None
    return result


# -- part 2 -------------------------------------------------------------------------------------------------

def real_server(seconds: float, url: str | None, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    server = None
    if url is None:
        try:
            server = EngineProcess.start(["--tp-size", "2", "--port", "0"], env=env, timeout_s=300.0, cwd=ROOT)
        except EngineStartError as e:
            raise SystemExit(f"serve did not start: {e}") from None
        url = server.url
    rec = subprocess.Popen([sys.executable, "-m", "tuner", "record", url, "--out", str(out), "--overwrite",
                            "--load", "2", "--max-new-tokens", "64", "--duration", f"{seconds}s"],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    t0 = time.monotonic()
    while rec.poll() is None:
        time.sleep(5.0)
        samples.append((round(time.monotonic() - t0, 1), round(rss_mb(rec.pid), 1), round(file_mb(out), 3)))
    err = rec.stderr.read()
    if server is not None:
        server.stop(timeout=60.0)
    live = [s for s in samples if not math.isnan(s[1])]
    first, last = live[1] if len(live) > 2 else live[0], live[-1]
    # RSS trend after the first 20 s (imports, first polls): least squares over the samples.
    pts = [(t, m) for t, m, _ in live if t >= 20] or [(t, m) for t, m, _ in live]
    mt, mm = sum(t for t, _ in pts) / len(pts), sum(m for _, m in pts) / len(pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (m - mm) for t, m in pts) / var if var else 0.0
    from tuner.recording import open_recording
    r = open_recording(out)
    n = sum(1 for _ in r.records())
    result = {"seconds": seconds, "records": n, "records_per_s": round(n / seconds, 1), "file_mb": round(file_mb(out), 2),
              "file_mb_per_recorded_hour": round(file_mb(out) / seconds * 3600, 1),
              "rss_first_mb": first[1], "rss_last_mb": last[1], "rss_max_mb": max(m for _, m, _ in live),
              "rss_trend_mb_per_hour": round(slope * 3600, 1),
              "rc": rec.returncode, "problem": r.problem, "samples": samples, "stderr_tail": err.strip().splitlines()[-1:]}
    r.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=120.0, help="recorded minutes of the synthetic feed")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120.0, help="real-server recording length (0: skip)")
    ap.add_argument("--url", default=None, help="record this server instead of starting one")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="record-soak-") as tmp:
        print(f"part 1: synthetic feed, {args.minutes:g} recorded minutes, {args.gpus} GPUs", flush=True)
        syn = synthetic(args.minutes, args.gpus, Path(tmp) / "synthetic.db")
        print(f"  writer: {syn['written_records_per_s']} records/s vs {syn['live_records_per_s']} live "
              f"-> keeps up x{syn['keeps_up_ratio']}; file {syn['file_mb']} MB "
              f"({syn['file_mb_per_recorded_hour']} MB per recorded hour); RSS {syn['rss_start_mb']} -> "
              f"{syn['rss_end_mb']} MB (peak {syn['peak_rss_mb']})")
        print(f"  report of it: {syn['report_s']} s, peak RSS {syn['report_peak_rss_mb']} MB (rc {syn['report_rc']})")
        real = None
        if args.seconds > 0:
            print(f"part 2: record --load 2 against serve --tp-size 2 (CPU) for {args.seconds:g} s", flush=True)
            real = real_server(args.seconds, args.url, Path(tmp) / "real.db")
            print(f"  {real['records']} records ({real['records_per_s']}/s), file {real['file_mb']} MB -> "
                  f"{real['file_mb_per_recorded_hour']} MB per recorded hour; recorder RSS {real['rss_first_mb']} -> "
                  f"{real['rss_last_mb']} MB (max {real['rss_max_mb']}, trend after 20 s {real['rss_trend_mb_per_hour']:+} MB/h); "
                  f"rc {real['rc']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": "python benchmarks/record_soak.py " + " ".join(sys.argv[1:]),
                                         "machine": f"{os.cpu_count()} CPUs, {sys.platform}, Python {sys.version.split()[0]}",
                                         "synthetic": syn, "real_server": real}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
