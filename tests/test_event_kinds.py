"""Event kinds are named constants (tuner/core/events.py), never string literals, anywhere in tuner/.

An AST scan of every module finds the places a kind is written: an Event's kind, the kind handed to
the Store's or a recording's `events`/`last_event`, to `event_text`, to an emitter, a comparison
with an event's `.kind` (or a `kind` variable), a `.kind.startswith(...)`, and a set, tuple, list or
mapping of kinds given a name. A string there must be a constant of the events module; so must any
known kind anywhere in those places. Words that are not kinds (a connection state "degraded", the
`server_info` key of a recording's header) are not in those places and are left alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tuner.core import events as E

ROOT = Path(__file__).resolve().parents[1] / "tuner"
HOME = ROOT / "core" / "events.py"

KINDS = frozenset(v for cls in (E.EventKind, E.TuningKind) for k, v in vars(cls).items() if k.isupper())
# Calls whose first argument is an event kind (or kinds): the timeline's readers and the emitters.
KIND_ARG_CALLS = frozenset({"events", "last_event", "event_text", "on_event", "_emit"})
# ... and those whose every positional argument is one.
ALL_KIND_ARGS_CALLS = frozenset({"events_of"})
WRAPPERS = frozenset({"frozenset", "set", "tuple", "list"})


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string literals of `node`: itself, or the elements of a set/tuple/list display."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [x for e in node.elts for x in _strings(e)]
    return []


def _is_kind(node: ast.AST) -> bool:
    """`<anything>.kind` or a variable named `kind`."""
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (isinstance(node, ast.Name)
                                                                           and node.id == "kind")


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _unwrap(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Call) and _name(node.func) in WRAPPERS and len(node.args) == 1:
        node = node.args[0]
    return node


def literal_kinds(source: str) -> list[tuple[int, str]]:
    """(line, text) of every event kind written as a string literal in `source`."""
    hits: list[ast.Constant] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name == "Event":
                hits += _strings(node.args[1]) if len(node.args) > 1 else []
                hits += [x for kw in node.keywords if kw.arg == "kind" for x in _strings(kw.value)]
            elif name in KIND_ARG_CALLS and node.args:
                hits += _strings(node.args[0])
            elif name in ALL_KIND_ARGS_CALLS:
                hits += [x for a in node.args for x in _strings(a)]
            elif name == "startswith" and isinstance(node.func, ast.Attribute) and _is_kind(node.func.value):
                hits += _strings(node.args[0]) if node.args else []
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides):
                # `backend.kind == "sglang"` is a server kind: only known event kinds count here.
                hits += [x for s in sides for x in _strings(s) if x.value in KINDS]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = _unwrap(node.value)
            if isinstance(value, ast.Dict):
                keys = [x for k in value.keys if k is not None for x in _strings(k)]
                if len(keys) > 1 and all(k.value in KINDS for k in keys):   # {"note": ...} is a key
                    hits += keys
                # A table keyed by kinds may mix constants and literals: a literal kind is one too many.
                elif any(isinstance(k, ast.Attribute) for k in value.keys):
                    hits += [k for k in keys if k.value in KINDS]
            else:
                found = _strings(value)
                if found and not isinstance(value, ast.Constant) and all(x.value in KINDS for x in found):
                    hits += found
    return [(x.lineno, x.value) for x in sorted(hits, key=lambda x: (x.lineno, x.col_offset))]


def test_no_event_kind_is_a_string_literal_outside_the_events_module():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == HOME:
            continue
        found += [f"{path.relative_to(ROOT.parent)}:{line}: {text!r}"
                  for line, text in literal_kinds(path.read_text(encoding="utf-8"))]
    assert not found, "event kinds written as strings (use tuner.core.events' constants):\n" + "\n".join(found)


def test_the_scan_finds_each_way_a_kind_is_written():
    src = '''
e = Event(t, "config_changed", {})
store.events(("disconnected", "connected"))
data.last_event("note", at=3)
if e.kind == "tuning_probe" or e.kind in ("load_started", "x"):
    pass
if kind == "sglang" or e.kind.startswith("tuning_"):
    pass
NOTABLE = frozenset({"server_info", "trace_captured"})
TEXT = {K.NOTE: f, "tuning_started": g}
self.on_event("relaunch_started", {})
'''
    assert [t for _, t in literal_kinds(src)] == [
        "config_changed", "disconnected", "connected", "note", "tuning_probe", "load_started", "tuning_",
        "server_info", "trace_captured", "tuning_started", "relaunch_started"]


def test_words_that_are_not_kinds_are_left_alone():
    src = '''
state = "degraded" if slow else "connected"
info = header.get("server_info")
doc = {"note": note, "source": "server_info"}
if backend.kind == "sglang" or x.kind == "switch":
    pass
'''
    assert literal_kinds(src) == []


def test_every_kind_is_named_once():
    # Two constants with one value would be two names for one kind.
    values = [v for cls in (E.EventKind, E.TuningKind) for k, v in vars(cls).items() if k.isupper()]
    assert len(values) == len(set(values))
    assert all(v.startswith(E.TUNING_PREFIX) for v in E.TUNING_KINDS)
