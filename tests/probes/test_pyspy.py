"""py-spy: the collapsed-stack parser as properties, and real sampling of a real Python child."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.pyspy import (
    PySpyError, PySpyPermissionError, dump_process, find_py_spy, function_shares, parse_collapsed, parse_frame,
    profile_from_outputs, sample_processes, validate_pids,
)

CHILD = r"""
import threading, time
def waiting_for_peers():
    while True:
        time.sleep(0.2)
def busy_rank_loop():
    x = 0
    while True:
        for i in range(5000):
            x += i * i
threading.Thread(target=waiting_for_peers, daemon=True, name="waiter").start()
print("ready", flush=True)
busy_rank_loop()
"""


# -- the parser (first: the busy child below would slow these down) --------------------------------

names = st.text(alphabet=st.characters(whitelist_categories=("L", "N"), whitelist_characters="_<>."), min_size=1, max_size=10)
frames = st.builds(lambda f, file, line: f"{f} ({file}.py:{line})", names, names, st.integers(1, 5000))
stacks = st.lists(st.tuples(st.integers(1, 99999), names, st.lists(frames, min_size=1, max_size=6), st.integers(1, 500)),
                  max_size=15)


def _render(stks) -> str:
    return "\n".join(f"thread ({tid}): {tname};{';'.join(fs)} {n}" for tid, tname, fs, n in stks)


@settings(max_examples=60, deadline=None)
@given(stacks)
def test_parse_collapsed_round_trip(stks):
    parsed = parse_collapsed(_render(stks) + "\ngarbage line without count\n\n")
    assert parsed == [(str(tid), tuple(fs), n) for tid, _, fs, n in stks]  # the thread name is not a frame


@settings(max_examples=60, deadline=None)
@given(stacks)
def test_function_shares_add_up(stks):
    parsed = [(tid, tuple(fs), n) for tid, _, fs, n in stks]
    rows = function_shares(parsed, top=None)
    total = sum(n for *_, n in stks)
    if total:
        assert sum(r.own_pct for r in rows) == pytest.approx(100.0)
    for r in rows:
        assert 0 <= r.own <= r.total <= total
    assert [r.own for r in rows] == sorted((r.own for r in rows), reverse=True)


def test_parse_frame_shapes():
    assert parse_frame("forward (refengine/models/llama.py:88)") == ("forward", "refengine/models/llama.py", 88)
    assert parse_frame("<module> (<string>:2)") == ("<module>", "<string>", 2)
    assert parse_frame("gc_collect (nothing)") == ("gc_collect", "nothing", None)
    assert parse_frame("weird") == ("weird", "", None)


def test_profile_shares_from_three_recordings():
    everything = "thread (1): MainThread;a (x.py:1);b (x.py:2) 60\nthread (2): t;w (x.py:9) 60\n"
    active = "thread (1): MainThread;a (x.py:1);b (x.py:2) 54\nthread (2): t;w (x.py:9) 6\n"
    gil = "thread (1): MainThread;a (x.py:1);b (x.py:2) 30\n"
    p = profile_from_outputs(7, everything, active, gil)
    assert (p.threads, p.ticks, p.thread_samples, p.samples) == (2, 60, 120, 60)
    assert p.idle_pct == pytest.approx(50.0) and p.gil_pct == pytest.approx(50.0)
    assert p.functions[0].function == "b" and p.functions[0].own_pct == pytest.approx(90.0)


# -- real py-spy on a real child --------------------------------------------------------------------

@pytest.fixture(scope="module")
def child():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # py-spy needs a started interpreter
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_real_child_top_function_idle_and_gil(child):
    res = sample_processes([child], duration_s=1, rate=50)
    (p,) = res.processes
    assert p.error is None and p.threads == 2 and p.ticks > 10
    assert res.functions[0].function == "busy_rank_loop" and res.functions[0].own_pct > 50
    assert res.functions[0].file.endswith("<string>") or res.functions[0].line is not None
    # two threads, one of them sleeping nearly all the time: about half the thread samples are idle
    assert 30 < p.idle_pct < 60  # the busy thread is never idle, so at most ~50 %
    assert p.gil_pct > 50  # the busy loop holds the GIL
    assert res.samples == p.samples and res.to_dict()["processes"][0]["pid"] == child


def test_dump_shows_who_holds_the_gil(child):
    threads = dump_process(child)
    by_name = {t["thread_name"]: t for t in threads}
    assert set(by_name) == {"MainThread", "waiter"}
    assert by_name["waiter"]["active"] is False


def test_missing_process_is_a_clear_error():
    with pytest.raises(PySpyError, match="does not exist"):
        sample_processes([2**22 + 12345], duration_s=1)


def test_one_dead_rank_does_not_hide_the_others(child):
    res = sample_processes([child, 2**22 + 12345], duration_s=1, rate=20)
    assert res.processes[0].error is None and "does not exist" in res.processes[1].error
    assert res.warnings == [res.processes[1].error]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to another user")
def test_missing_ptrace_permission_says_what_to_do(child):
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", find_py_spy()]
    with pytest.raises(PySpyPermissionError, match="ptrace_scope") as e:
        sample_processes([child], duration_s=1, py_spy=as_nobody)
    assert "\n" not in str(e.value)
    with pytest.raises(PySpyPermissionError):
        dump_process(child, py_spy=as_nobody)


def test_py_spy_not_installed():
    with pytest.raises(PySpyError, match="not installed"):
        sample_processes([os.getpid()], duration_s=1, py_spy=["/nonexistent/py-spy"])


@pytest.mark.parametrize("bad", [["1; rm -rf /"], [True], [-5], [0], ["12a"], [1.5], [None]])
def test_only_integer_pids_reach_a_command(bad):
    with pytest.raises(ValueError, match="not a process id"):
        validate_pids(bad)


def test_pid_strings_from_metrics_labels_are_accepted():
    assert validate_pids(["123", 456]) == [123, 456]
