"""Every JSON input file `serve` reads (the adaptive schedule, the acceptance profile) goes through
one bounded reader (probes.json_file): regular files only, opened non-blocking, a size cap, nesting
bounded, and one line on any error. The red team's N10/N11: deep nesting and a 5000-digit integer
gave tracebacks, /dev/zero was read without bound, a FIFO blocked forever. And N3: a schedule of
300 000 tiers was taken, after which every /metrics scrape took 15 s."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from probes import adaptive_policy
from probes.json_file import JsonFileError, read_json
from refengine.server.options import OptionsError, parse_options

FLAGS = {"adaptive": ["--speculative-adaptive", "--speculative-adaptive-config"],
         "profile": ["--speculative-simulate-accept-profile"]}


def _hostile(tmp_path: Path, kind: str) -> str:
    path = tmp_path / f"{kind}.json"
    if kind == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "digits":
        path.write_text('{"1": {"candidate_steps": [' + "9" * 5000 + "]}}")
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "big":
        path.write_bytes(b" " * ((16 << 20) + 1))
    elif kind == "dir":
        path.mkdir()
    elif kind == "utf16":
        path.write_text("{}", encoding="utf-16")
    return str(path)


@pytest.mark.parametrize("flag", sorted(FLAGS))
@pytest.mark.parametrize("kind, words", [
    ("deep", "nested deeper"), ("digits", "not JSON"), ("zero", "a device"), ("fifo", "a FIFO"),
    ("big", "larger than 16 MiB"), ("dir", "a directory"), ("utf16", "not UTF-8"),
])
def test_hostile_files_are_refused_in_one_line(tmp_path: Path, flag, kind, words):
    path = _hostile(tmp_path, kind)
    with pytest.raises(OptionsError) as e:
        parse_options([*FLAGS[flag], path])
    msg = str(e.value)
    assert "\n" not in msg and words in msg and len(msg) < 400, msg


def test_the_reader_reads_a_good_file(tmp_path: Path):
    p = tmp_path / "ok.json"
    p.write_text('\ufeff{"a": [1, 2]}', encoding="utf-8")
    assert read_json(p) == {"a": [1, 2]}
    with pytest.raises(JsonFileError, match="cannot read"):
        read_json(tmp_path / "missing.json")


def test_schedules_are_capped_in_tiers_and_candidates(tmp_path: Path):
    many = {str(i): {"candidate_steps": [1, 2, 3]} for i in range(1, 300_001)}
    with pytest.raises(adaptive_policy.AdaptiveConfigError, match="at most 64"):
        adaptive_policy.parse_config(many)
    with pytest.raises(adaptive_policy.AdaptiveConfigError, match="at most 32"):
        adaptive_policy.parse_config({"1": {"candidate_steps": list(range(33))}})
    ok = {str(i): {"candidate_steps": [1, 2]} for i in range(1, 65)}
    assert len(adaptive_policy.parse_config(ok)) == 64
    path = tmp_path / "many.json"
    path.write_text(json.dumps(many))
    with pytest.raises(OptionsError, match="at most 64"):
        parse_options(["--speculative-adaptive", "--speculative-adaptive-config", str(path)])


def test_a_huge_live_schedule_is_refused_and_metrics_stays_cheap(tp2_server, tp2_config):
    """Live: /set_internal_state refuses 300 000 tiers at once (it took 42 s and then slowed every
    scrape); active_config's dict is built once per epoch, not per scrape."""
    import httpx

    many = {str(i): {"candidate_steps": [1, 2, 3]} for i in range(1, 300_001)}
    with httpx.Client(base_url=tp2_server.url, timeout=120) as c:
        r = c.post("/set_internal_state", json={"server_args": {"speculative_adaptive_config": many}})
        assert r.status_code == 400 and "at most 64" in r.json()["error"]["message"], r.text[:300]
        assert c.get("/metrics").status_code == 200


