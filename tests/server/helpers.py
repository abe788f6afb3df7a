"""Starting real `serve` processes for the server tests: the suite's harness (tests/harness.py)
with the server's default model.
"""

from __future__ import annotations

from harness import ROOT, START_TIMEOUT_S, checked_server, pid_alive, rank_pids, start_server, wait_gone  # noqa: F401

# No --model-path: the default, i.e. the shipped tiny model (trained, so acceptance is real and
# text is text), or the agreeing random-weight preset where the weights are not installed.
MODEL_ARGS: list[str] = []
