"""A real Prometheus (Debian's `prometheus` binary) for the fleet tests: a generated config scraping
the given loopback targets every second, a free port (never :9090, which the package's service may
hold), a storage folder under the test's tmp dir. Stopped (SIGTERM, then SIGKILL) when the block ends.
Must not be used outside tests.
"""

from __future__ import annotations

import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from harness import free_port, wait_until

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_S = 1


def config_text(jobs: dict[str, list[str]]) -> str:
    lines = ["global:", f"  scrape_interval: {SCRAPE_S}s", f"  scrape_timeout: {SCRAPE_S}s",
             f"  evaluation_interval: {SCRAPE_S}s", "scrape_configs:"]
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:",
                  "      - targets: [" + ", ".join(f'"{t}"' for t in targets) + "]"]
    return "\n".join(lines) + "\n"


@contextmanager
def running_prometheus(tmp: Path, jobs: dict[str, list[str]]) -> Iterator[str]:
    """The base URL of a ready Prometheus scraping `jobs` ({job: ["127.0.0.1:PORT", ...]})."""
    cfg = tmp / "prometheus.yml"
    cfg.write_text(config_text(jobs))
    proc = None
    for attempt in range(3):          # a free port can be taken between the check and the bind
        port = free_port()
        log = open(tmp / f"prometheus-{attempt}.log", "wb")
        proc = subprocess.Popen([BINARY, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / f'tsdb{attempt}'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool | None:
            if proc.poll() is not None:
                return None
            try:
                return httpx.get(url + "/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        try:
            wait_until(lambda: ready() or proc.poll() is not None, 60, "Prometheus to be ready")
        except AssertionError:
            proc.kill()
            raise
        if proc.poll() is None:
            break
        log.close()
    else:
        raise AssertionError("Prometheus did not start: " + (tmp / "prometheus-2.log").read_text()[-2000:])
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
