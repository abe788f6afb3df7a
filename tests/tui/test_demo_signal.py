"""`demo`'s way out on a closed terminal or a kill: the signal's SystemExit unwinds to the teardown,
and when Python drops that exception (it lands in a finalizer, say) a watchdog still runs the
teardown and ends the process. A real child process, a real SIGHUP."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import signal, sys, threading
    from pathlib import Path
    from tuner.commands import demo
    demo.TEARDOWN_S = 0.5
    marker = Path(sys.argv[1])
    demo._TEARDOWN.append(lambda: marker.write_text("torn down"))

    def lost(signum, frame):
        try:
            demo._exit_on_signal(signum, frame)
        except SystemExit:
            pass       # the raise lost, as when it lands in a finalizer: nothing unwinds

    signal.signal(signal.SIGHUP, lost)
    print("ready", flush=True)
    threading.Event().wait()   # without the watchdog this process would never end
""")


def test_a_lost_exit_on_sighup_still_tears_down_and_ends_the_process(tmp_path):
    marker = tmp_path / "teardown"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=60) == 128 + signal.SIGHUP
        assert marker.read_text() == "torn down"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
