"""Profile request parsing, trace-file listing by name only, the API-key check, and SSE framing."""

import pytest

from refengine.server import auth, sse
from refengine.server.profiles import ProfileRequestError, TraceFiles, parse_profile_request


def test_profile_request_defaults_and_refusals(tmp_path):
    r = parse_profile_request({"output_dir": str(tmp_path), "num_steps": 3, "profile_id": "p1",
                               "with_stack": False}, device="cpu")
    assert (r.output_dir, r.num_steps, r.profile_id, r.with_stack, r.record_shapes) == \
        (str(tmp_path), 3, "p1", False, True)
    assert r.activities == ("CPU",)  # GPU asked on a CPU engine records nothing, so it is dropped
    assert parse_profile_request({}, device="cuda").activities == ("CPU", "GPU")
    for body, match in [({"num_steps": 0}, "num_steps"), ({"num_steps": "3"}, "num_steps"),
                        ({"profile_id": "../x"}, "profile_id"), ({"activities": ["MEM"]}, "activities"),
                        ({"merge_profiles": True}, "not supported"), ({"with_stack": 1}, "with_stack")]:
        with pytest.raises(ProfileRequestError, match=match):
            parse_profile_request(body, device="cpu")


def test_trace_listing_and_locate_by_name_only(tmp_path):
    t = TraceFiles()
    t.add_dir(str(tmp_path))
    (tmp_path / "p1-TP-0.trace.json.gz").write_bytes(b"x" * 5)
    (tmp_path / "p1-TP-1.trace.json.gz").write_bytes(b"y")
    (tmp_path / "notes.txt").write_text("no")
    (tmp_path / "evil-TP-2.trace.json.gz").symlink_to("/etc/hostname")
    names = [(f["name"], f["rank"], f["profile_id"], f["size"]) for f in t.listing()]
    assert sorted(names) == [("p1-TP-0.trace.json.gz", 0, "p1", 5), ("p1-TP-1.trace.json.gz", 1, "p1", 1)]
    assert t.locate("p1-TP-1.trace.json.gz") == tmp_path / "p1-TP-1.trace.json.gz"
    for bad in ("../p1-TP-0.trace.json.gz", "/etc/passwd", "notes.txt", "evil-TP-2.trace.json.gz",
                "p9-TP-0.trace.json.gz"):
        assert t.locate(bad) is None


def test_api_key():
    assert auth.authorized(None, "/generate", None)
    assert not auth.authorized("k", "/generate", None)
    assert not auth.authorized("k", "/set_internal_state", "Bearer wrong")
    assert auth.authorized("k", "/set_internal_state", "Bearer k")
    assert auth.authorized("k", "/health", None) and auth.authorized("k", "/metrics", None)
    assert auth.authorized("k", "/ready", None)  # SGLang's utils/auth.py:102-104


def test_sse_round_trip():
    body = sse.event({"text": "a", "output_ids": [1]}) + sse.event({"text": "ab"}) + sse.DONE
    assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")
    assert sse.parse(body) == [{"text": "a", "output_ids": [1]}, {"text": "ab"}, "[DONE]"]
    assert sse.parse(sse.error_event("bad"))[0]["error"]["message"] == "bad"


def test_ready_is_503_until_serving_and_after():
    """GET /ready's rule over the app's three facts (a unit test of the route's logic; the live
    200 is in test_http.py): starting, stopping or engine gone -> 503, never a body."""
    import threading
    import types

    from refengine.server.handlers import ready

    def app(started: bool, stopping: bool, alive: bool):
        flags = [threading.Event(), threading.Event()]
        if started:
            flags[0].set()
        if stopping:
            flags[1].set()
        return types.SimpleNamespace(ready=flags[0], stopping=flags[1], engine_alive=lambda: alive)

    assert ready(app(True, False, True), None).status == 200
    for facts in ((False, False, True), (True, True, True), (True, False, False)):
        r = ready(app(*facts), None)
        assert (r.status, r.body) == (503, b""), facts
