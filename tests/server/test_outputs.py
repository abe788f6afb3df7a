"""SGLang's output shapes: cumulative text/ids, stop strings trimmed, finish reasons, spec meta_info."""

from refengine.messages import SpecStats
from refengine.server.inputs import Sampling
from refengine.server.outputs import RequestOutput, completion_reply


def dec(ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def out(**kw):
    return RequestOutput(rid="r1", prompt_tokens=3, sampling=Sampling(**kw), decode=dec, launch_num_draft_tokens=4)


def test_cumulative_text_and_final_meta():
    o = out(max_new_tokens=4)
    o.add(list(b"ab"))
    assert o.generate_reply()["text"] == "ab" and "e2e_latency" not in o.meta_info()
    o.add(list(b"cd"), finished=True, reason="length",
          spec=SpecStats(spec_verify_ct=2, spec_num_correct_drafts=2, spec_num_proposed_drafts=6,
                         spec_correct_drafts_histogram=[1, 0, 1]))
    r = o.generate_reply()
    assert r["output_ids"] == list(b"abcd") and r["text"] == "abcd"
    m = r["meta_info"]
    assert m["finish_reason"] == {"type": "length", "length": 4} and m["completion_tokens"] == 4
    assert m["spec_accept_length"] == 2.0 and abs(m["spec_accept_rate"] - 1 / 3) < 1e-9
    assert m["spec_correct_drafts_histogram"] == [1, 0, 1] and m["e2e_latency"] >= 0


def test_stop_string_trims_and_drops_later_tokens():
    o = out(stop=("XY",))
    assert o.add(list(b"abX")) is False
    assert o.add(list(b"YZZ")) is True
    assert o.finished and o.text == "ab" and o.finish_reason == {"type": "stop", "matched": "XY"}
    assert o.output_ids == list(b"abXY")  # tokens after the one completing the stop are dropped


def test_eos_stop_and_abort_reasons():
    o = out()
    o.add([97, 256], finished=True, reason="stop", matched=256)
    assert o.finish_reason == {"type": "stop", "matched": 256} and o.text == "a"
    a = out()
    a.add([], finished=True, reason="error", message="rank died")
    assert a.finish_reason == {"type": "abort", "message": "rank died", "status_code": 503,
                               "err_type": "ServiceUnavailable"}


def test_half_multibyte_char_held_back():
    o = out()
    e = "é".encode()
    o.add([e[0]])
    assert o.text == ""
    o.add([e[1]])
    assert o.text == "é"


def test_completion_reply_shape():
    o = out()
    o.add(list(b"hi"), finished=True, reason="length", spec=SpecStats(spec_verify_ct=1))
    r = completion_reply("cmpl-1", "m", [o], None)
    assert r["object"] == "text_completion" and r["choices"][0]["text"] == "hi"
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
