"""`record` stops at its first write failure (the red team's N8: on a full disk it ran on to
--duration with a frozen progress line and said so only at the end), and a recording that cannot
be created leaves nothing behind (N17). The disk is "full" for a real `record` child through
RLIMIT_FSIZE: writes past the limit fail with EFBIG (Python ignores SIGXFSZ)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tuner.recording import Recorder
from tuner.recording.schema import RecordingError

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_record_stops_at_the_first_write_failure(tp2_server, tmp_path):
    out = tmp_path / "full.db"
    env = {k: v for k, v in os.environ.items() if k != "SPECDECODE_API_KEY"}
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tuner", "record", tp2_server.url, "--out", str(out),
                        "--duration", "600s", "--load", "2", "--max-new-tokens", "16", "--progress-every", "1"],
                       cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=300, preexec_fn=_limit_file_size(160 << 10))
    took = time.monotonic() - started
    assert p.returncode == 1, p.stderr[-600:]
    assert "stopped" in p.stderr and ("full" in p.stderr or "large" in p.stderr or "disk" in p.stderr), p.stderr[-600:]
    assert "Traceback" not in p.stderr
    # It ended on the failure, not at --duration (10 minutes).
    assert took < 300, took


def test_a_recording_that_cannot_be_created_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "never.db"
    # The DDL is written in the first transaction: make the file unwritable-by-size from the start.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, hard))
    try:
        with pytest.raises(RecordingError, match="cannot create recording"):
            Recorder(out, {"backend": "x"})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not out.exists() and not Path(str(out) + "-wal").exists() and not Path(str(out) + "-shm").exists()


def test_a_failed_csv_report_leaves_no_empty_directory(tmp_path):
    """The red team's N17: `report --csv DIR` that fails to write (disk full) left DIR behind, empty."""
    from synthetic import write

    db = write(tmp_path / "s.db")
    csv_dir = tmp_path / "csv"
    env = {k: v for k, v in os.environ.items() if k != "SPECDECODE_API_KEY"}
    p = subprocess.run([sys.executable, "-m", "tuner", "report", str(db), "--csv", str(csv_dir)], cwd=ROOT,
                       env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
                       preexec_fn=_limit_file_size(0))
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-500:]
    assert not csv_dir.exists() or any(csv_dir.iterdir()), "an empty directory was left behind"
