"""Admission's request-id and slot bookkeeping as pure logic: a recording stand-in for the engine
client (it only notes submits and aborts and answers when told), so every path that ends a
request can be driven in order and the invariant "nothing in flight => nothing held" checked."""

from __future__ import annotations

import pytest

from refengine.messages import GenUpdate
from refengine.server.generation import Admission, Generation, run_all, slot_problems
from refengine.server.inputs import BadRequest, GenerateInput, Sampling


class RecordingEngine:
    def __init__(self) -> None:
        self.callbacks: dict = {}
        self.aborted: list[str] = []

    def submit(self, req, on_update) -> None:
        self.callbacks[req.rid] = on_update

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    def finish(self, rid: str, reason: str = "length") -> None:
        self.callbacks.pop(rid)(GenUpdate(rid, [97], True, reason))


class Bytes:
    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


def gen(adm: Admission, rid: str | None, max_new: int = 4, stop: tuple[str, ...] = ()) -> Generation:
    item = GenerateInput(text="ab", input_ids=None, sampling=Sampling(max_new_tokens=max_new, stop=stop), rid=rid)
    return Generation(adm, Bytes(), item, speculative=True, context_length=None, on_finish=lambda out: None)


def clean(adm: Admission, engine: RecordingEngine) -> list[str]:
    return slot_problems(adm.held(), len(engine.callbacks))


def test_duplicate_in_one_batch_reserves_nothing():
    eng = RecordingEngine()
    adm = Admission(eng, cap=2)
    with pytest.raises(BadRequest, match=r"^Duplicate request ID detected: x$"):
        run_all([gen(adm, "y"), gen(adm, "x"), gen(adm, "x")])
    assert adm.held()["reserved_rids"] == [] and eng.callbacks == {}


def test_id_in_flight_refused_then_free_after_the_engine_ends_it():
    eng = RecordingEngine()
    adm = Admission(eng, cap=2)
    first = gen(adm, "x")
    first.start()
    with pytest.raises(BadRequest, match="Duplicate request ID detected: x"):
        gen(adm, "x").start()
    assert list(eng.callbacks) == ["x"], "the refused request never reached the engine"
    eng.finish("x")
    assert first.step() and first.out.finished
    assert clean(adm, eng) == [] and adm.held()["reserved_rids"] == []
    again = gen(adm, "x")   # an id is reusable once its request ended
    again.start()
    assert list(eng.callbacks) == ["x"]


def test_stop_string_keeps_the_id_until_the_engine_abort_comes_back():
    eng = RecordingEngine()
    adm = Admission(eng, cap=1)
    g = gen(adm, "s", max_new=8, stop=("b",))
    g.start()
    eng.callbacks["s"](GenUpdate("s", [ord("a"), ord("b")]))
    assert g.step() and g.out.finished and eng.aborted == ["s"]
    held = adm.held()
    assert held["in_flight"] == [] and held["running"] == ["s"]
    assert clean(adm, eng) != [], "held with nothing in flight is reported until the engine ends it"
    eng.finish("s", "abort")
    assert clean(adm, eng) == [] and adm.held()["running"] == []


def test_cancel_while_waiting_frees_the_place_and_the_id():
    eng = RecordingEngine()
    adm = Admission(eng, cap=1)
    a, b = gen(adm, "a"), gen(adm, "b")
    a.start()
    b.start()
    assert adm.held()["waiting"] == ["b"]
    b.cancel("client disconnected")
    assert adm.held()["waiting"] == [] and "b" not in adm.held()["reserved_rids"]
    assert b.out.finish_reason == {"type": "abort", "message": "client disconnected", "status_code": None,
                                   "err_type": None}
    eng.finish("a")
    a.step()
    assert clean(adm, eng) == [] and list(eng.callbacks) == []


def test_failed_batch_cancels_the_prompts_it_never_started():
    class Failing(RecordingEngine):
        def submit(self, req, on_update) -> None:
            if req.rid == "2":
                raise RuntimeError("queue closed")
            super().submit(req, on_update)

    eng = Failing()
    adm = Admission(eng, cap=4)
    gens = [gen(adm, str(i)) for i in range(4)]
    with pytest.raises(RuntimeError):
        run_all(gens)
    for rid in list(eng.callbacks):
        eng.finish(rid, "abort")
    held = adm.held()
    assert held["reserved_rids"] == [] and held["running"] == [] and held["waiting"] == []


def test_zero_tokens_reserves_and_releases():
    eng = RecordingEngine()
    adm = Admission(eng, cap=1)
    out = run_all([gen(adm, "z", max_new=0)])[0]
    assert out.finished and adm.held()["reserved_rids"] == []
