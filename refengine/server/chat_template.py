"""A model's chat template, rendered the way Hugging Face's `apply_chat_template` renders it.

SGLang 0.5.23 renders chat messages with the tokenizer's `chat_template`
(`sglang/srt/entrypoints/openai/serving_chat.py:2322-2330`, `apply_chat_template(tokenize=False,
add_generation_prompt=...)`), and transformers compiles that template in a sandboxed jinja2
environment with `trim_blocks`, `lstrip_blocks`, the loop-controls extension, a `tojson` that does
not escape HTML, `raise_exception` and `strftime_now`, and passes the special tokens (`bos_token`,
`eos_token`, ...) as variables. This module does the same with jinja2 alone, so the HTTP process
needs neither transformers nor torch.

Must not tokenize (the caller encodes the rendered text without adding special tokens, as SGLang
does) and must never let a template reach Python internals: templates are untrusted code. A render
is bounded in time and in steps (every loop iteration and every call counts one, so a loop or a
macro that prints nothing and uses no operator is bounded too) and in size (the prompt, and any
string or list `*`/`+` builds): past the bounds the request is a 400.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from refengine.server.inputs import BadRequest

# Used when a model directory has no `chat_template` (the random-weight presets): one line per
# message, `role: content`, then `assistant: ` when a reply is asked for. The shipped tiny model's
# tokenizer_config.json carries the same template, so both answer chat requests alike.
PLAIN_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                  "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                      "mask_token")


class ChatTemplateError(ValueError):
    """The template could not be loaded (a broken tokenizer_config.json or template syntax)."""


class _Generation(jinja2.ext.Extension):
    """HF's `{% generation %}...{% endgeneration %}` (it marks assistant tokens for training);
    rendering just emits the body, which is all transformers does outside mask tracking."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # As transformers: jinja's own tojson escapes HTML characters, which changes prompts.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# Bounds of one render (a template is the model directory's code, run for every chat request): the
# prompt's size, the time spent, and the size of any string or list an operator builds. Far above
# what a real template needs; past them the request is a 400, never a stalled HTTP process.
MAX_RENDER_CHARS = 4 << 20
MAX_RENDER_S = 2.0
MAX_POW_BITS = 1 << 16
# Loop iterations plus calls (macros, methods, `loop(...)`) in one render. Ten million is thousands
# of times what a real template takes for the largest body the server reads; it makes the bound
# hold the same on a slow host, where the deadline alone would let more run.
MAX_RENDER_STEPS = 10_000_000
_render = threading.local()


class RenderLimit(jinja2.exceptions.TemplateError):
    """A render went past one of its bounds."""


def _check_time() -> None:
    deadline = getattr(_render, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise RenderLimit(f"rendering took longer than {MAX_RENDER_S:g} s")


def _step() -> None:
    """One loop iteration or call of the render: counted against MAX_RENDER_STEPS, and the
    deadline checked (nested loops or a doubly recursive macro that print nothing and use no
    operator would otherwise run for hours)."""
    steps = getattr(_render, "steps", None)
    if steps is None:
        return
    _render.steps = steps + 1
    if steps >= MAX_RENDER_STEPS:
        raise RenderLimit(f"more than {MAX_RENDER_STEPS} loop iterations and calls")
    _check_time()


def _bounded_iter(iterable: Any) -> Iterator[Any]:
    """What a `{% for %}` loops over, one step per item."""
    for v in iterable:
        _step()
        yield v


def _bounded_range(*args: Any) -> Iterator[int]:
    """The sandbox's range (at most MAX_RANGE items), one step per item."""
    return _bounded_iter(safe_range(*args))


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles `~` (string concatenation) to the sandbox's bounded join, so a loop that doubles a
    string with it stops at the bound instead of at the host's memory, and what a `{% for %}`
    iterates to the sandbox's counted iterator."""

    def visit_For(self, node: jinja2.nodes.For, frame: Any) -> None:
        # (A recursive loop's deeper items go through `loop(...)`: see _Sandbox.call.)
        counted = jinja2.nodes.Call(jinja2.nodes.EnvironmentAttribute("bounded_iter"), [node.iter], [], None, None,
                                    lineno=node.lineno)
        super().visit_For(jinja2.nodes.For(node.target, counted, node.body, node.else_, node.test, node.recursive,
                                           lineno=node.lineno), frame)

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(ImmutableSandboxedEnvironment):
    """Bounds `*`, `+`, `**` and `~` before computing them ('x' * 10**9 allocated 1 GB per request)."""

    intercepted_binops = frozenset(["*", "+", "**"])
    code_generator_class = _BoundedCodeGenerator

    def bounded_iter(self, iterable: Any) -> Iterator[Any]:
        return _bounded_iter(iterable)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        # Every call in a template comes here (macros, methods, `loop(...)`): one step each.
        _step()
        if isinstance(__obj, LoopContext) and args:
            args = (_bounded_iter(args[0]), *args[1:])    # a recursive loop's items, counted like any loop's
        return super().call(__context, __obj, *args, **kwargs)

    def bounded_concat(self, parts: tuple) -> str:
        _check_time()
        texts = [p if isinstance(p, str) else str(p) for p in parts]
        if sum(map(len, texts)) > MAX_RENDER_CHARS:
            raise RenderLimit(f"a value longer than {MAX_RENDER_CHARS} items")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_time()
        sized = (str, list, tuple)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, sized) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_RENDER_CHARS:
                    raise RenderLimit(f"a value longer than {MAX_RENDER_CHARS} items")
        elif operator == "+":
            if isinstance(left, sized) and isinstance(right, sized) and len(left) + len(right) > MAX_RENDER_CHARS:
                raise RenderLimit(f"a value longer than {MAX_RENDER_CHARS} items")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                    right * max(1, abs(left).bit_length()) > MAX_POW_BITS:
                raise RenderLimit("a number too large")
        return super().call_binop(context, operator, left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["range"] = _bounded_range
    return env


def _token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template syntax error (line {e.lineno}): {e.message}") from None
        self.source = source
        self.special_tokens = dict(special_tokens or {})

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, extra: dict[str, Any] | None = None) -> str:
        """The prompt text; a template's own refusal (`raise_exception`) or error is a 400."""
        variables = {**self.special_tokens, **(extra or {})}
        _render.deadline = time.monotonic() + MAX_RENDER_S
        _render.steps = 0
        try:
            parts, size = [], 0
            # Streamed, so the prompt's size and the time are checked as it grows.
            for part in self._template.generate(messages=messages, tools=tools, documents=None,
                                                add_generation_prompt=add_generation_prompt, **variables):
                size += len(part)
                if size > MAX_RENDER_CHARS:
                    raise RenderLimit(f"the rendered prompt is longer than {MAX_RENDER_CHARS} characters")
                _check_time()
                parts.append(part)
            return "".join(parts)
        except RenderLimit as e:
            raise BadRequest(f"the chat template went past its bounds: {e}") from None
        except (RecursionError, OverflowError, MemoryError) as e:
            raise BadRequest(f"the chat template went past its bounds: {type(e).__name__}") from None
        except jinja2.exceptions.SecurityError as e:
            raise BadRequest(f"the chat template refused the messages: {e}") from None
        except jinja2.exceptions.TemplateError as e:
            raise BadRequest(f"the chat template refused the messages: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise BadRequest(f"the chat template could not render the messages: {type(e).__name__}: {e}") from None
        finally:
            _render.deadline = None
            _render.steps = None


def _pick(chat_template: Any) -> str | None:
    """transformers allows a list of named templates; the chat route uses the one named default."""
    if isinstance(chat_template, str):
        return chat_template
    if isinstance(chat_template, list):
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def load_chat_template(model_path: str | None) -> ChatTemplate:
    """The model directory's template (tokenizer_config.json, else chat_template.jinja beside it,
    as transformers reads them), or PLAIN_TEMPLATE where the model has none."""
    special: dict[str, str] = {}
    source: str | None = None
    if model_path:
        d = Path(model_path)
        cfg_file = d / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                cfg = json.loads(cfg_file.read_text())
            except (OSError, ValueError) as e:
                raise ChatTemplateError(f"{cfg_file.name}: {e}") from None
            if isinstance(cfg, dict):
                source = _pick(cfg.get("chat_template"))
                for k in SPECIAL_TOKEN_KEYS:
                    text = _token_text(cfg.get(k))
                    if text is not None:
                        special[k] = text
        jinja_file = d / "chat_template.jinja"
        if source is None and jinja_file.is_file():
            source = jinja_file.read_text()
    return ChatTemplate(source if source is not None else PLAIN_TEMPLATE, special)
