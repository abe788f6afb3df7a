"""Reading sglang 0.5.23's own source from the installed wheel, without its dependencies.

Two uses: static inspection (ast) for the contract tests, and running a few of SGLang's own
pure-Python definitions (the adaptive step policy and controller, the /set_internal_state
dispatcher) so the plugin's hooks are exercised against SGLang's real logic instead of a
re-implementation. `load_definitions` compiles the named top-level definitions of one wheel
module into a fresh module; the names they import from the rest of SGLang (which would pull in
torch kernels, msgspec, ...) are supplied by the caller and said so at the call site.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path
from typing import Any


def module_path(src: Path, dotted: str) -> Path:
    """sglang/<...>.py for a dotted module name (src is the `sglang/` directory)."""
    parts = dotted.split(".")
    assert parts[0] == "sglang"
    p = src.joinpath(*parts[1:])
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else p / "__init__.py"


def parse(src: Path, dotted: str) -> ast.Module:
    return ast.parse(module_path(src, dotted).read_text(encoding="utf-8"))


def top_level(tree: ast.Module) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def self_attrs(cls: ast.ClassDef) -> set[str]:
    """Attributes assigned as self.X anywhere in the class, plus its properties and methods."""
    out = set(methods(cls))
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            out.add(node.attr)
    return out


def arg_names(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def resolve(src: Path, dotted: str) -> ast.AST | None:
    """The ast node of `module.Class.method` / `module.Class` / `module.func`, or None."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:cut])
        if module_path(src, mod).exists():
            node: Any = top_level(parse(src, mod)).get(parts[cut])
            for name in parts[cut + 1:]:
                if not isinstance(node, ast.ClassDef):
                    return None
                node = methods(node).get(name)
            return node
    return None


_STDLIB_OK = {"__future__", "bisect", "json", "logging", "math", "functools", "typing",
              "dataclasses", "collections", "enum"}


def load_definitions(src: Path, dotted: str, names: list[str], provided: dict[str, Any],
                     register_as: str | None = None) -> types.ModuleType:
    """A module holding SGLang's own code for `names` from `dotted`, plus `provided` globals."""
    tree = parse(src, dotted)
    keep: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _STDLIB_OK:
            keep.append(node)
        elif isinstance(node, ast.Import) and all(a.name.split(".")[0] in _STDLIB_OK for a in node.names):
            keep.append(node)
    defs = top_level(tree)
    missing = [n for n in names if n not in defs]
    if missing:
        raise AssertionError(f"{dotted} no longer defines {missing}")
    seen: set[int] = set()
    for node in tree.body:            # keep source order so later definitions see earlier ones
        if any(defs.get(n) is node for n in names) and id(node) not in seen:
            seen.add(id(node))
            keep.append(node)
    mod = types.ModuleType(register_as or dotted)
    mod.__dict__.update(provided)
    mod.__dict__.setdefault("logger", __import__("logging").getLogger(dotted))
    code = compile(ast.Module(body=keep, type_ignores=[]), str(module_path(src, dotted)), "exec")
    if register_as:
        sys.modules[register_as] = mod
    exec(code, mod.__dict__)
    return mod


def plugin_framework_env(target: Path) -> str:
    """Python code that makes `import sglang.srt.plugins` load from the wheel at `target`.

    sglang/__init__.py imports SGLang's runtime dependencies (orjson, ...), which this
    environment does not have; the plugin framework itself (sglang.srt.plugins, hook_registry,
    environ) needs only the standard library. So the top-level package object is created
    without running its initializer, and everything below it is SGLang's own code.
    """
    return (
        "import sys, types\n"
        f"_pkg = types.ModuleType('sglang'); _pkg.__path__ = [{str(target / 'sglang')!r}]\n"
        "sys.modules.setdefault('sglang', _pkg)\n"
    )


def load_method(src: Path, dotted: str, cls: str, method: str, provided: dict[str, Any]) -> Any:
    """One method of a wheel class, compiled as a plain function (call it with a stand-in `self`);
    the names it uses from the rest of SGLang are `provided` by the caller."""
    node = methods(top_level(parse(src, dotted))[cls])[method]
    node = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    ns: dict[str, Any] = {"Optional": Any, **provided}
    exec(compile(node, str(module_path(src, dotted)), "exec"), ns)
    return ns[method]
