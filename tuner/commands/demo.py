"""`specdecode-tune demo`: start the embedded engine, put load on it, and open the TUI attached to it.

The engine runs as a child `python -m refengine serve` (TP 2 on CPU with the shipped model; every
local GPU when there are any) on a free loopback port, started by tuner.engine_process: its own
process group, its log in a temporary file, SIGTERM to it if this process dies. Everything is torn
down on the way out, however the TUI ends: no child is left.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from tuner.engine_process import EngineProcess, EngineStartError

READY_TIMEOUT_S = 180.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tuner.commands.options import add_load_arguments, add_tui_tune_arguments

    parser.add_argument("--tp-size", type=int, default=None,
                        help="TP ranks (default: every local GPU, else 2 CPU ranks)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when NVML sees a GPU, else cpu")
    parser.add_argument("--emulate-comm-latency", default=None, metavar="A_us[,B_us_per_KB]",
                        help="add an emulated latency to every collective (shown as emulation)")
    parser.add_argument("--port", type=int, default=0, help="server port (default: any free one)")
    add_load_arguments(parser)
    add_tui_tune_arguments(parser)
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


_SIGNALLED: list[int] = []
# What must run however the demo ends (stopping the engine); the signal watchdog runs it too.
_TEARDOWN: list[Callable[[], object]] = []
TEARDOWN_S = 12.0


def _exit_on_signal(signum: int, frame: object) -> None:
    # A closed terminal (SIGHUP) or a kill (SIGTERM) must still run the teardown in `run`: the
    # SystemExit below unwinds to its `finally`. Python drops an exception raised where it cannot
    # propagate (a finalizer or a weakref callback running when the signal lands), and the demo
    # would live on with no terminal and its engine. So the first signal also starts a watchdog.
    first = not _SIGNALLED
    _SIGNALLED.append(signum)
    if first:
        threading.Thread(target=_watchdog, args=(signum,), name="demo-signal-watchdog", daemon=True).start()
    raise SystemExit(128 + signum)


def _watchdog(signum: int) -> None:
    """After TEARDOWN_S, if the process is still here, run the teardown from this thread and leave."""
    threading.Event().wait(TEARDOWN_S)
    for step in list(_TEARDOWN):
        try:
            step()
        except Exception:  # the exit below matters more than a teardown step's error
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(128 + signum)


def server_args(device: str, tp: int, port: int, emulate: str | None) -> list[str]:
    args = ["--tp-size", str(tp), "--device", device, "--host", "127.0.0.1", "--port", str(port)]
    if emulate:
        args += ["--emulate-comm-latency", emulate]
    return args


def run(args: argparse.Namespace) -> int:
    from tuner.commands.options import TUI_GPUS_EVERY_S, OpenError, fail, open_session, run_tui, tui_inputs

    gpus = local_gpu_count()
    device = args.device or ("cuda" if gpus else "cpu")
    tp = args.tp_size or (gpus if device == "cuda" and gpus else 2)
    try:
        prompts, limits = tui_inputs(args)
    except OpenError as e:
        return fail("demo", e)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    log_dir = Path(tempfile.mkdtemp(prefix="specdecode-demo-"))
    print(f"starting the engine: TP {tp} on {device} (log: {log_dir / 'server.log'}) …", file=sys.stderr)
    try:
        # In its own session, so Ctrl-C in the TUI's terminal does not reach the ranks behind the
        # app's back; SIGTERM to the engine when this process dies, however it dies (even SIGKILL).
        engine = EngineProcess.start(server_args(device, tp, args.port, args.emulate_comm_latency),
                                     log_path=log_dir / "server.log", timeout_s=READY_TIMEOUT_S,
                                     die_with_parent=True)
    except EngineStartError as e:   # the engine is gone by now
        tail = "\n".join(e.log_tail.splitlines()[-15:])
        print(f"specdecode-tune demo: {e}\n{tail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    _TEARDOWN.append(lambda: engine.stop(timeout=5.0, grace_s=2.0))
    try:
        # The key, when set, is $SPECDECODE_API_KEY (demo has no key flags), checked like any other.
        with open_session(args, engine.url, gpus_every_s=TUI_GPUS_EVERY_S) as opened:
            return run_tui(opened, args.load, prompts, limits, args.max_new_tokens)
    except OpenError as e:
        print(f"specdecode-tune demo: {e}\n{engine.log_tail()}", file=sys.stderr)
        return e.rc
    except KeyboardInterrupt:
        return 130
    finally:
        engine.stop(timeout=15.0, grace_s=5.0)
        if _SIGNALLED:
            # The signal tore the app down mid-run, so Textual's terminal threads (not daemons)
            # were never stopped and would hold the interpreter at exit, on a terminal that may be
            # gone. The engine is stopped: leave now.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(128 + _SIGNALLED[0])
