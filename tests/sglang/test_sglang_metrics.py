"""The plugin's counters as SGLang's /metrics exports them: prometheus_client in multiprocess
mode over PROMETHEUS_MULTIPROC_DIR, written by one process (a "scheduler") and collected by
another with the same MultiProcessCollector SGLang mounts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WRITE = r"""
from probes.inserver.sglang_metrics import PhaseMetrics
m = PhaseMetrics(rank=RANK)
m.set_rank_info("00000000:3B:00.0")
m.add([{"seq": 1, "phase_ms": {"draft": 2.0, "verify": 4.0, "verify_sample": 1.0,
                                 "draft_extend": 1.0, "other": 0.0}, "accepted": [0, 2, 3]},
       {"seq": 2, "phase_ms": {"draft": 2.0, "verify": 4.0}, "accepted": [1]}])
"""

COLLECT = r"""
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
reg = CollectorRegistry()
multiprocess.MultiProcessCollector(reg)
print(generate_latest(reg).decode())
"""


def _py(code: str, d: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(d), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_counters_reach_sglangs_multiprocess_metrics(tmp_path):
    _py(WRITE.replace("RANK", "0"), tmp_path)
    _py(WRITE.replace("RANK", "1"), tmp_path)
    text = _py(COLLECT, tmp_path)
    lines = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
             for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert lines['specdecode:phase_seconds_total{phase="verify",rank="0"}'] == 0.008
    assert lines['specdecode:phase_seconds_total{phase="verify",rank="1"}'] == 0.008
    assert lines['specdecode:phase_seconds_total{phase="draft",rank="1"}'] == 0.004
    assert 'specdecode:phase_seconds_total{phase="other",rank="0"}' not in lines   # zero: not added
    assert lines['specdecode:iterations_total{rank="0"}'] == 2
    # Acceptance is counted on rank 0 only: k=0 all request-verifies, k = at least k drafts.
    assert lines['specdecode:accept_position_total{k="0"}'] == 4
    assert lines['specdecode:accept_position_total{k="1"}'] == 3
    assert lines['specdecode:accept_position_total{k="3"}'] == 1
    info = [k for k in lines if k.startswith("specdecode:rank_info{")]
    assert len(info) == 2 and all('pci_bus_id="00000000:3B:00.0"' in k for k in info)
