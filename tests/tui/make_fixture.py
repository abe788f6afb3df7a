"""Make the TUI's committed recording: the real engine (TP 2 on CPU, the shipped tiny model) under
load, recorded by the headless core's Recorder while the setting changes twice and a trace is
captured.

    python -m tests.tui.make_fixture tests/tui/fixtures/engine.db   (from the repository root)

The snapshot tests replay this file, so it is regenerated only on purpose (then the snapshots are
updated after looking at them). The script runs the session exactly as `attach` does, without the TUI.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tuner.backends import connect
from tuner.commands.attach import builtin_prompts
from tuner.core.capture import capture_into
from tuner.core.session import Session
from tuner.recording import Recorder

from .helpers import Engine

# (seconds after the load starts, the change) — a steps change, then the draft leaves the TP group
# for rank 0 (on CPU, replicated runs the whole draft on both ranks' shared cores: see the what-if).
# Each setting runs long enough for the A/B to reach a verdict; the screenshots' captions are
# checked against it (tests/tui/test_screenshot_claims.py).
SCRIPT = ((12.0, {"speculative_num_steps": 4}), (26.0, {"speculative_draft_placement": "rank0"}))
CAPTURE_AT_S = 44.0
LENGTH_S = 50.0
CONCURRENCY = 4          # as `demo` runs it


def record(path: Path) -> None:
    # serve's default model: the shipped tiny target and its EAGLE-3 head (real acceptance).
    engine = Engine("--speculative-num-steps", "3", "--max-running-requests", "4", model_args=[])
    try:
        backend = connect(engine.url)
        header = {"backend": backend.kind, "url": backend.url, "server_info": backend.info,
                  "capabilities": backend.capabilities.as_dict(), "command": "tests/tui/make_fixture.py"}
        session = Session(backend, recorder=Recorder(path, header, overwrite=True))
        session.start()
        session.start_load(builtin_prompts(), concurrency=CONCURRENCY, max_new_tokens=48)
        t0, todo, captured = time.monotonic(), list(SCRIPT), False
        while (elapsed := time.monotonic() - t0) < LENGTH_S:
            if todo and elapsed >= todo[0][0]:
                result = session.set_config(todo.pop(0)[1], by="fixture")
                print(f"{elapsed:5.1f}s {result}", file=sys.stderr)
            if not captured and elapsed >= CAPTURE_AT_S:
                # The same glue the capture key runs; it blocks, so the tick catches up after it.
                capture_into(session, progress=lambda text, frac=None: print(text, file=sys.stderr), num_steps=3)
                captured = True
            session.tick()
            time.sleep(0.1)
        session.close()
    finally:
        engine.stop()


if __name__ == "__main__":
    record(Path(sys.argv[1]))
