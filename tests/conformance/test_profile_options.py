"""`/start_profile` options against SGLang 0.5.23's ProfileReq, field by field, and prefixed captures.

SGLang's fields: `sglang/srt/managers/io_struct.py:2374-2400` (ProfileReq); file naming
`sglang/srt/managers/scheduler_components/profiler_manager.py:333-358`:
`{profile_prefix}-{profile_id}-TP-{rank}[...].trace.json.gz`. Every field is either honoured or
refused with a 400 naming it; none is ignored. The live test checks that a prefixed capture is
written as SGLang names it and that `analyze` reads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import httpx
import pytest

from probes.capture import _is_capture_file
from probes.trace_analysis import analyze_paths, find_rank_files
from refengine.server.profiles import ProfileRequestError, parse_profile_request
from tests.harness import wait_until
from tests.server.helpers import MODEL_ARGS, ROOT, checked_server

# (field, value, what SGLang does, what we do: a ProfileRequest attribute check or the refusal)
ROWS = [
    ("output_dir", "/x/y", "traces go there", lambda r: r.output_dir == "/x/y"),
    ("start_step", 5, "profiling starts at that forward step", "start_step is not supported"),
    ("num_steps", 3, "stops by itself after that many steps", lambda r: r.num_steps == 3),
    ("activities", ["CPU"], "records those activities", lambda r: r.activities == ("CPU",)),
    ("activities", ["MEM"], "memory snapshot", "activities: ['MEM'] not supported"),
    ("profile_by_stage", True, "prefill and decode apart", "profile_by_stage is not supported"),
    ("with_stack", False, "default True", lambda r: r.with_stack is False),
    ("record_shapes", False, "default True", lambda r: r.record_shapes is False),
    ("profile_id", "cap-1", "the file name's id", lambda r: r.profile_id == "cap-1"),
    ("merge_profiles", True, "rank 0 merges the ranks' files", "merge_profiles is not supported"),
    ("profile_prefix", "pre", '"{prefix}-" in front of the file name', lambda r: r.file_stem.startswith("pre-")),
    ("profile_stages", ["DECODE"], "only those stages", "profile_stages is not supported"),
    ("detailed_annotations", True, "iteration-level annotations", "detailed_annotations is not supported"),
]


@pytest.mark.parametrize("field, value, sglang, ours", ROWS, ids=[f"{r[0]}={r[1]}" for r in ROWS])
def test_profile_req_fields(field, value, sglang, ours):
    if isinstance(ours, str):
        with pytest.raises(ProfileRequestError, match=ours.replace("[", r"\[").replace("]", r"\]")):
            parse_profile_request({field: value}, device="cpu")
    else:
        assert ours(parse_profile_request({field: value}, device="cpu")), sglang


def test_defaults_match_profile_req():
    r = parse_profile_request({}, device="cuda")
    assert (r.with_stack, r.record_shapes, r.num_steps, r.profile_prefix) == (True, True, None, "")
    assert r.activities == ("CPU", "GPU") and r.file_stem == r.profile_id


@pytest.mark.parametrize("prefix", ["../x", "a/b", " x"])
def test_prefix_cannot_leave_the_directory(prefix):
    with pytest.raises(ProfileRequestError, match="profile_prefix"):
        parse_profile_request({"profile_prefix": prefix, "profile_id": "p"}, device="cpu")


def test_capture_file_match_accepts_the_prefix():
    assert _is_capture_file("pre-cap1-TP-1.trace.json.gz", "cap1")
    assert _is_capture_file("cap1-TP-0.trace.json.gz", "cap1")
    assert not _is_capture_file("pre-cap10-TP-0.trace.json.gz", "cap1")


@pytest.mark.slow
def test_prefixed_capture_written_as_sglang_names_it_and_analysed(tmp_path):
    with checked_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0"]) as s, \
            httpx.Client(base_url=s.url, timeout=300) as http:
        r = http.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "cap1",
                                              "profile_prefix": "pre", "num_steps": 3,
                                              "with_stack": False, "record_shapes": False})
        assert r.status_code == 200, r.text
        body = {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 48,
                                                                              "temperature": 0}}
        t = threading.Thread(target=lambda: http.post("/generate", json=body))
        t.start()
        wait_until(lambda: len(list(tmp_path.glob("*.trace.json.gz"))) >= 2, 120, "both ranks' trace files")
        t.join()
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["pre-cap1-TP-0.trace.json.gz", "pre-cap1-TP-1.trace.json.gz"]
        listed = {f["name"] for f in http.get("/specdecode/traces").json()["files"]}
        assert set(names) <= listed
        http.post("/stop_profile")
    files = find_rank_files(tmp_path)
    assert sorted(p.name for p in files) == names
    assert [r.rank for r in analyze_paths(files).ranks] == [0, 1]
    out = subprocess.run([sys.executable, "-m", "tuner", "analyze", str(tmp_path), "--json"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert [r["file"] for r in json.loads(out.stdout)["ranks"]] == names
