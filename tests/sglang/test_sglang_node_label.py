"""A multi-node launch names its leader: the plugin labels every rank's `specdecode:rank_info` with
SGLang's --dist-init-addr (the same on every node of one model) and the node rank, read from SGLang's
parallel context as the wheel itself reads them; through SGLang's multiprocess /metrics; and the
fleet groups a follower node under the one server whose ranks carry the same address, where host
names and rank counts alone cannot tell two multi-node servers apart."""

from __future__ import annotations

import sys
import types

from probes.inserver import sglang_plugin
from test_sglang_metrics import COLLECT, _py
from tuner.fleet.followers import FOLLOWER, SERVER, plan
from tuner.fleet.members import Member


def _context(monkeypatch, **parallel) -> None:
    """SGLang's runtime_context as the scheduler process has it (get_parallel() only)."""
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: types.SimpleNamespace(**parallel)
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)


def test_the_plugin_reads_the_launch_address_from_sglangs_parallel_context(monkeypatch, sglang_src):
    # The wheel reads these three from get_parallel() itself (engine.py, runtime_context.py).
    text = "".join((sglang_src / "srt" / f).read_text() for f in ("runtime_context.py", "entrypoints/engine.py"))
    for attr in ("nnodes", "dist_init_addr", "node_rank"):
        assert f"get_parallel().{attr}" in text, attr
    _context(monkeypatch, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    assert sglang_plugin._node() == ("10.0.0.1:5000", "1")
    _context(monkeypatch, nnodes=1, node_rank=0, dist_init_addr=None)
    assert sglang_plugin._node() == ("", "")
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", None)      # not in an SGLang process
    assert sglang_plugin._node() == ("", "")


def test_rank_info_carries_the_launch_address_through_multiprocess_metrics(tmp_path):
    _py('from probes.inserver.sglang_metrics import PhaseMetrics\n'
        'PhaseMetrics(rank=2).set_rank_info("00000000:3B:00.0", "node1", "10.0.0.1:5000", "1")\n', tmp_path)
    info = [ln for ln in _py(COLLECT, tmp_path).splitlines() if ln.startswith("specdecode:rank_info{")]
    assert len(info) == 1 and 'dist_init_addr="10.0.0.1:5000"' in info[0] and 'node_rank="1"' in info[0]
    assert 'host="node1"' in info[0] and 'tp_rank="2"' in info[0]


def _m(name):
    return Member(name, f"http://{name}", source="prometheus", labels={"instance": name})


def test_a_follower_joins_the_server_launched_with_its_address():
    a, b, fol = _m("a:30000"), _m("b:30000"), _m("f:30001")
    roles = {"a:30000": (SERVER, {"nnodes": 2, "tp_size": 4}), "b:30000": (SERVER, {"nnodes": 2, "tp_size": 4}),
             "f:30001": (FOLLOWER, None)}
    ranks = {"a:30000": [{"host": "n0", "tp_rank": "0", "dist_init_addr": "n0:5000"}],
             "b:30000": [{"host": "n8", "tp_rank": "0", "dist_init_addr": "n8:5000"}],
             "f:30001": [{"host": "n9", "tp_rank": "2", "dist_init_addr": "n8:5000", "node_rank": "1"}]}
    g = plan([a, b, fol], roles, ranks)
    assert g.followers == {"b:30000": ["f:30001"]} and g.notes == []
    assert g.members[1].labels["follower_instances"] == "f:30001"     # for the leader's row's GPUs
    # Without the address (an older plugin) both have room for its ranks: one line, no guess.
    bare = {k: [{x: y for x, y in r.items() if x != "dist_init_addr"} for r in v] for k, v in ranks.items()}
    g = plan([a, b, fol], roles, bare)
    assert g.followers == {} and "one of a:30000, b:30000" in g.notes[0]
