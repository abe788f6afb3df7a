"""speculation_profile.json both ways: the schema's rules (dense K-long vectors, non-increasing
marginals, mean = 1 + Σ marginals within 0.02), the refusals the simulator makes, and the export
from a recording whose counts are known (phase records through the real reader and Recorder)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from probes import accept_buckets as AB
from probes import speculation_profile as SP
from tuner.backends.derive import PhaseStreamReader
from tuner.cli import main
from tuner.core.records import Event
from tuner.recording import Recorder

CHAIN = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
         "speculative_draft_placement": "sharded"}
LABEL = "steps=3 topk=1 draft_tokens=4 placement=sharded"


def run(capsys, *args: object) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


# -- the schema's rules ------------------------------------------------------------------------------

@pytest.mark.parametrize("h, k", [([5, 3, 2, 10], 3), ([1], 4), ([0, 0, 7], 2), ([3, 0, 0, 0, 0, 1], 5)])
def test_a_built_profile_keeps_the_schema_rules(h, k):
    p = SP.build(h, k, chain=True, target_model="meta-llama/Llama-3.1-8B-Instruct",
                 draft_checkpoint="/home/someone/ckpt/eagle3-llama")
    assert len(p["conditional_accept_rates"]) == len(p["marginal_accept_rates"]) == k     # dense, K long
    m = p["marginal_accept_rates"]
    assert all(b <= a for a, b in zip(m, m[1:]))                                       # non-increasing
    assert abs(p["mean_accept_length"] - (1 + sum(m))) <= 0.02                          # the mean
    assert p["validation"]["mean_consistency"]["passed"] and p["validation"]["marginal_monotonicity"]["passed"]
    assert sum(p["acceptance_length_histogram"].values()) == sum(h)
    assert list(p["acceptance_length_histogram"]) == [str(j) for j in range(1, k + 2)]  # lengths, bonus included
    assert p["accept_length_model"] == "chain_analytic" and p["max_supported_k"] == k
    assert p["target_model"]["id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert p["draft_checkpoint"]["id"] == "eagle3-llama"                                # never a local path
    SP.check(json.loads(json.dumps(p)))


def test_counts_beyond_k_and_empty_histograms_are_refused():
    with pytest.raises(SP.ProfileError, match="understated"):
        SP.build([1, 1, 1], 1, chain=True)
    with pytest.raises(SP.ProfileError, match="no verify steps"):
        SP.build([0, 0], 1, chain=True)


def _good() -> dict:
    return SP.build([10, 20, 30, 40], 3, chain=True)


@pytest.mark.parametrize("change, words", [
    ({"measured": False}, "measured: false"),
    ({"schema_version": "2.0"}, "schema_version"),
    ({"marginal_accept_rates": [0.5, 0.4]}, "exactly num_speculative_tokens = 3"),
    ({"conditional_accept_rates": [0.5, 1.4, 0.2]}, "probabilities in [0, 1]"),
    ({"marginal_accept_rates": [0.5, 0.6, 0.2], "mean_accept_length": 2.3}, "marginal_monotonicity"),
    ({"mean_accept_length": 3.5}, "mean_consistency"),
    ({"validation": {"mean_consistency": {"passed": False}}}, "own validation says mean_consistency failed"),
    ({"accept_length_model": "magic"}, "accept_length_model"),
])
def test_check_refuses_in_one_line(change, words):
    p = {**_good(), **change}
    with pytest.raises(SP.ProfileError) as e:
        SP.check(p)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_simulator_refuses_a_tree_for_a_chain_and_steps_beyond_k():
    chain = SP.simulator(_good())
    assert chain.refuse(3, 1) is None and chain.refuse(2, 1) is None and chain.refuse(3, 2) is None
    assert "max_supported_k 3" in chain.refuse(4, 1)
    assert chain.alphas(3) == pytest.approx(_good()["conditional_accept_rates"])
    tree = SP.simulator(SP.build([10, 20, 30, 40], 3, chain=False))
    assert "tree" in tree.refuse(3, 1) and tree.refuse(3, 4) is None
    assert "K=3" in chain.spec


def test_read_takes_one_profile_or_a_list_of_one(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps([_good()]))
    two.write_text(json.dumps([_good(), _good()]))
    assert SP.read(one)["num_speculative_tokens"] == 3
    with pytest.raises(SP.ProfileError, match="holds 2 profiles"):
        SP.read(two)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SP.ProfileError, match="not JSON"):
        SP.read(tmp_path / "bad.json")


# -- export from a recording with known counts ---------------------------------------------------------

def _records(n_iters: int, seed: int = 1, topk: int = 1, ndt: int = 4) -> list[dict]:
    """Phase records of one setting (steps 3): batches of 1..12 requests, contexts 50..1500."""
    rnd = random.Random(seed)
    out = []
    for i in range(n_iters):
        bs = rnd.choice([1, 2, 5, 9, 12])
        acc = [min(3, int(rnd.expovariate(0.6))) for _ in range(bs)]
        out.append({"seq": i + 1, "t": 1000.0 + i * 0.01, "epoch": 1, "steps": 3, "topk": topk,
                    "num_draft_tokens": ndt, "placement": "sharded", "bs": bs, "wall_ms": 5.0, "phase_ms": {"verify": 4.0},
                    "accepted": acc, "ctx": [rnd.randint(50, 1500) for _ in range(bs)]})
    return out


def _record(path: Path, records: list[dict], page: int = 7, setting: dict = CHAIN) -> None:
    info = {"kind": "refengine", "version": "0.1.0", "model": "/models/tiny/target", "tp_size": 2,
            "launch": {**setting, "model_path": "/models/tiny/target", "speculative_draft_model_path": "/m/eagle3"},
            "active": dict(setting)}
    rec = Recorder(path, {"backend": "refengine", "url": "http://127.0.0.1:1", "server_info": info,
                          "active": dict(setting), "launch": info["launch"], "command": "test"})
    reader = PhaseStreamReader()
    t0 = 2_000_000_000.0
    out = [Event(t0, "server_info", info)]
    reader.update(t0, {"next": 0, "dropped": 0, "records": []})
    for i in range(0, len(records), page):
        chunk = records[i:i + page]
        samples, events = reader.update(t0 + 1 + i / 10, {"next": chunk[-1]["seq"], "dropped": 0, "records": chunk})
        out += samples + events
    rec.write(out)
    rec.close()


def test_the_export_has_the_recorded_counts_whole_and_per_bucket(tmp_path, capsys):
    records = _records(300)
    _record(tmp_path / "rec.db", records)
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--speculation-profile", tmp_path / "p.json")
    assert rc == 0, err
    [p] = json.loads((tmp_path / "p.json").read_text())
    flat = [a for r in records for a in r["accepted"]]
    assert p["acceptance_length_histogram"] == {str(j + 1): flat.count(j) for j in range(4)}
    assert p["measurement_conditions"]["verify_rounds"] == len(flat)
    assert p["mean_accept_length"] == pytest.approx(1 + sum(flat) / len(flat))
    assert p["target_model"]["id"] == "target" and p["draft_checkpoint"]["id"] == "eagle3"
    assert "/models" not in json.dumps(p)
    buckets = AB.histograms(records)
    assert set(p["per_category"]) == {b for b, h in buckets.items() if sum(h)}
    for name, h in buckets.items():
        cat = p["per_category"][name]
        assert cat["num_verify_steps"] == sum(h)
        assert cat["acceptance_length_histogram"] == {str(j + 1): (h[j] if j < len(h) else 0) for j in range(4)}
    assert {"bs1", "bs2", "bs4", "bs8", "ctx1", "ctx256", "ctx512", "ctx1024"} <= set(p["per_category"])
    SP.check(p)


def test_a_tree_setting_exports_as_measured_per_k(tmp_path, capsys):
    tree = {**CHAIN, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}
    _record(tmp_path / "tree.db", _records(300, topk=2, ndt=6), setting=tree)
    rc, err = run(capsys, "report", tmp_path / "tree.db", "--speculation-profile", tmp_path / "p.json")
    assert rc == 0, err
    [p] = json.loads((tmp_path / "p.json").read_text())
    assert p["accept_length_model"] == "measured_per_k" and p["num_speculative_tokens"] == 3
    assert p["measurement_conditions"]["setting"]["speculative_eagle_topk"] == 2
    assert "tree" in SP.simulator(p).refuse(3, 1)


def test_the_export_needs_200_rounds_and_a_known_setting(tmp_path, capsys):
    _record(tmp_path / "short.db", _records(20))
    rc, err = run(capsys, "report", tmp_path / "short.db", "--speculation-profile", tmp_path / "p.json")
    assert rc == 1 and "fewer than 200" in err and not (tmp_path / "p.json").exists()
    _record(tmp_path / "rec.db", _records(300))
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--speculation-profile", tmp_path / "p.json",
                  "--setting", "steps=9 topk=1")
    assert rc == 2 and "is not a speculative setting" in err and LABEL in err
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--speculation-profile", tmp_path / "p.json",
                  "--setting", LABEL)
    assert rc == 0 and len(json.loads((tmp_path / "p.json").read_text())) == 1
    # Output rules as for the other outputs: an existing file is kept without --overwrite.
    (tmp_path / "p.json").write_text("keep")
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--speculation-profile", tmp_path / "p.json")
    assert rc == 2 and "--overwrite" in err and (tmp_path / "p.json").read_text() == "keep"
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--speculation-profile", tmp_path / "p.json", "--overwrite")
    assert rc == 0 and json.loads((tmp_path / "p.json").read_text())[0]["measured"] is True
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--setting", LABEL)
    assert rc == 2 and "needs --speculation-profile" in err
    rc = main(["report", str(tmp_path / "rec.db"), "--speculation-profile", "-", "--setting", LABEL])
    assert rc == 0 and json.loads(capsys.readouterr().out)[0]["measurement_conditions"]["setting_label"] == LABEL


def test_the_markdown_report_has_the_bucket_table(tmp_path, capsys):
    _record(tmp_path / "rec.db", _records(300))
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--out", tmp_path / "r.md")
    assert rc == 0, err
    text = (tmp_path / "r.md").read_text()
    assert "Acceptance by batch size and context length" in text
    assert "batch 8–15" in text and "context 256–511" in text and "context &lt; 256" in text
    rc, err = run(capsys, "report", tmp_path / "rec.db", "--out", tmp_path / "r.json")
    [setting] = json.loads((tmp_path / "r.json").read_text())["acceptance_by_bucket"]
    assert setting["setting"] == LABEL and setting["buckets"]["bs8"]["range"] == "batch 8–15"
    assert setting["verifies"] == sum(b["verifies"] for n, b in setting["buckets"].items() if n.startswith("bs"))
