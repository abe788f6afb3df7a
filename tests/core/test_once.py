"""`specdecode-tune once` in-process against the stand-in server (core_standin.py): the JSON shape,
a refused --set, and one-line errors for a dead URL or a bad argument."""

from __future__ import annotations

import json

from tuner.cli import main


def test_json_readings(standin, capsys):
    standin.iterate([1, 2])
    assert main(["once", standin.url, "--seconds", "0.6", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["server"]["kind"] == "refengine" and r["active"]["speculative_num_steps"] == 3
    assert r["connection"] == "connected" and r["has_phase_timers"]
    assert r["live"]["speculative_draft_placement"] == "live"
    assert r["accept_len"] is None                       # nothing decoded while watching: not available


def test_refused_change_and_table(standin, capsys):
    standin.refuse_next = "speculative_eagle_topk must be >= 1"
    rc = main(["once", standin.url, "--seconds", "0.3", "--set", "speculative_eagle_topk=0"])
    out = capsys.readouterr()
    assert rc == 1 and "change refused: speculative_eagle_topk must be >= 1" in out.err
    assert "server    refengine" in out.out and "no decode iterations while watching" in out.out


def test_one_line_errors(capsys):
    assert main(["once", "http://127.0.0.1:9"]) == 1          # the server's fault: 1, as every command says it
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot connect" in err
    assert main(["once", "http://127.0.0.1:9", "--set", "nonsense"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_a_change_settles_for_twenty_iterations_before_watching(standin, capsys):
    # The stand-in runs one iteration every 0.15 s after the change, the first 20 of them slow to
    # draft (the warm-up). Twenty take 3 s, longer than the 2-s time rule: `once` used to watch from
    # 2 s on and averaged warm-up iterations in; the one rule (tuner.core.windows) waits for them.
    import threading

    from harness import wait_until

    stop = threading.Event()

    def server_iterations() -> None:
        wait_until(lambda: standin.posts or stop.is_set(), 60, "the change")
        n = 0
        while not stop.is_set():
            n += 1
            warm = n <= 20
            standin.iterate([1, 1], phase_ms={"draft": 100.0 if warm else 3.0, "verify": 5.0, "verify_sample": 0.5,
                                              "draft_extend": 1.0, "other": 0.5})
            stop.wait(0.15)            # the stand-in's decode rate (pacing, not synchronisation)

    producer = threading.Thread(target=server_iterations, daemon=True)
    producer.start()
    try:
        assert main(["once", standin.url, "--seconds", "1", "--json", "--set", "speculative_num_steps=2"]) == 0
    finally:
        stop.set()
        producer.join(timeout=10)
    r = json.loads(capsys.readouterr().out)
    assert r["active"]["speculative_num_steps"] == 2
    assert r["phase_ms"]["draft"] == 3.0, "warm-up iterations were watched"


def test_prefill_is_read_and_printed_as_its_own_phase(standin, capsys):
    import threading

    phase = {"prefill": 2.0, "draft": 3.0, "verify": 5.0, "verify_sample": 0.5, "draft_extend": 1.0, "other": 0.5}
    comm = {"prefill": 0.5, "draft": 1.0, "verify": 1.5, "verify_sample": 0.0, "draft_extend": 0.2, "other": 0.0}
    stop = threading.Event()

    def decode() -> None:   # the stand-in decodes while `once` watches (the pace only spaces records)
        while not stop.wait(0.02):
            standin.iterate([1, 2], phase_ms=phase, comm_ms=comm, wall_ms=12.0)

    worker = threading.Thread(target=decode, daemon=True)
    worker.start()
    try:
        assert main(["once", standin.url, "--seconds", "1.0", "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert main(["once", standin.url, "--seconds", "1.0"]) == 0
        text = capsys.readouterr().out
    finally:
        stop.set()
        worker.join(10)
    assert r["phase_ms"]["prefill"] == 2.0 and r["phase_comm_ms"]["prefill"] == 0.5
    rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert rows[0] == ["prefill", "2.000", "0.500"] and rows[1][0] == "draft"   # drawn first
