"""A model's chat template is untrusted code run for every chat request: its render is bounded in
time and size, and going past a bound is a 400 (the red team's N12: range(10**9) and a recursive
macro were 500s, nested loops never ended, 'x' * 10**9 took 1 GB a request)."""

from __future__ import annotations

import time

import pytest

from refengine.server.chat_template import MAX_RENDER_S, ChatTemplate
from refengine.server.inputs import BadRequest

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source, words", [
    ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "longer than"),
    ("{{ 'x' * 10**9 }}", "a value longer than"),
    ("{{ [0] * 10**9 }}", "a value longer than"),
    ("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "a value longer than"),
    ("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "a value longer than"),
    ("{{ 7 ** 100000000 }}", "a number too large"),
    ("{% for i in range(99999) %}{{ 'y' * 1000 }}{% endfor %}", "rendered prompt is longer"),
])
def test_templates_past_their_bounds_are_400s(source, words):
    t0 = time.monotonic()
    with pytest.raises(BadRequest) as e:
        ChatTemplate(source).render(MESSAGES)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert time.monotonic() - t0 < MAX_RENDER_S + 10       # bounded (a hang detector on a busy host)


def test_ordinary_templates_render_as_before():
    t = ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] * 2 }}{{ 1 + 2 }}{{ 2 ** 10 }}"
                     "{{ '|' ~ m['role'] ~ 3 }}\n{% endfor %}{% for i in range(3) %}{{ i }}{% endfor %}")
    assert t.render(MESSAGES) == "user: hihi31024|user3\n012"
