"""`specdecode-tune demo`: start the embedded engine, put load on it, and open the TUI attached to it.

The engine runs as a child `python -m refengine serve` (TP 2 on CPU with the shipped model; every
local GPU when there are any) on a free loopback port, in its own process group, with its log in a
temporary file. Everything is torn down on the way out, however the TUI ends: no child is left.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_TIMEOUT_S = 180.0
READY = "The server is fired up and ready to roll!"
URL_IN_LINE = re.compile(r"(http://127\.0\.0\.1:\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tuner.commands.attach import add_load_arguments

    parser.add_argument("--tp-size", type=int, default=None,
                        help="TP ranks (default: every local GPU, else 2 CPU ranks)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when NVML sees a GPU, else cpu")
    parser.add_argument("--emulate-comm-latency", default=None, metavar="A_us[,B_us_per_KB]",
                        help="add an emulated latency to every collective (shown as emulation)")
    parser.add_argument("--port", type=int, default=0, help="server port (default: any free one)")
    add_load_arguments(parser)
    parser.set_defaults(load=4)


def local_gpu_count() -> int:
    """GPUs NVML sees on this host; 0 without a driver (the demo then runs on CPU)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:   # no driver, no library, a container without devices: all mean "no GPU"
        return 0


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the demo process dies, however it dies (even
    SIGKILL), so the engine never outlives it. Linux's PR_SET_PDEATHSIG."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG


def _exit_on_signal(signum: int, frame: object) -> None:
    # A closed terminal (SIGHUP) or a kill (SIGTERM) must still run the teardown in `run`.
    raise SystemExit(128 + signum)


def server_command(device: str, tp: int, port: int, emulate: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "refengine", "serve", "--tp-size", str(tp), "--device", device,
           "--host", "127.0.0.1", "--port", str(port)]
    if emulate:
        cmd += ["--emulate-comm-latency", emulate]
    return cmd


class EngineProcess:
    """The engine as a child process group; `stop()` ends all of it (ranks included)."""

    def __init__(self, cmd: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        # A new session: the ranks the server spawns share its group, so one killpg ends them all,
        # and Ctrl-C in the TUI's terminal does not reach them behind the app's back.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Wait for the server's ready line (it names the URL, so `--port 0` works) and return the URL."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine exited with status {self.proc.returncode}")
            try:
                text = self.log_path.read_text(errors="replace")
            except OSError:
                text = ""
            for line in text.splitlines():
                if READY in line and (m := URL_IN_LINE.search(line)):
                    return m.group(1)
            time.sleep(0.25)
        raise RuntimeError(f"the engine was not ready within {timeout:.0f} s")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the group (a rank that ignored SIGTERM) goes now.
        self._signal(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def run(args: argparse.Namespace) -> int:
    from tuner.backends import ServerError, connect
    from tuner.commands.attach import prompts_for, run_tui

    gpus = local_gpu_count()
    device = args.device or ("cuda" if gpus else "cpu")
    tp = args.tp_size or (gpus if device == "cuda" and gpus else 2)
    try:
        prompts = prompts_for(args)
    except (OSError, ValueError) as e:
        print(f"specdecode-tune demo: prompts: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    log_dir = Path(tempfile.mkdtemp(prefix="specdecode-demo-"))
    cmd = server_command(device, tp, args.port, args.emulate_comm_latency)
    print(f"starting the engine: TP {tp} on {device} (log: {log_dir / 'server.log'}) …", file=sys.stderr)
    engine = EngineProcess(cmd, log_dir / "server.log")
    try:
        try:
            url = engine.wait_ready()
            backend = connect(url)
        except (RuntimeError, ServerError) as e:
            print(f"specdecode-tune demo: {e}\n{engine.log_tail()}", file=sys.stderr)
            return 1
        return run_tui(backend, args.load, prompts, args.max_new_tokens)
    except KeyboardInterrupt:
        return 130
    finally:
        engine.stop()
