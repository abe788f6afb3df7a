"""A model's chat template is untrusted code run for every chat request: its render is bounded in
time and size, and going past a bound is a 400 (the red team's N12: range(10**9) and a recursive
macro were 500s, nested loops never ended, 'x' * 10**9 took 1 GB a request)."""

from __future__ import annotations

import time

import pytest

from refengine.server import chat_template
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


# Loops and calls that print nothing and use no operator (the deadline was only checked in range,
# operators and output, so these ran for hours): every iteration and call is a counted step.
NO_OUTPUT_LOOPS = [
    "{% for a in messages %}{% for b in messages %}{% for c in messages %}{% endfor %}{% endfor %}{% endfor %}",
    "{% for a in messages if a %}{% for b in messages if b %}{% endfor %}{% endfor %}",
    "{% macro f(s) %}{% if s %}{% set a = f(s[1:]) %}{% set b = f(s[1:]) %}{% endif %}{% endmacro %}"
    "{{ f('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') }}",
    "{% for a in messages recursive %}{% if loop.depth < 6 %}{% set x = loop(messages) %}{% endif %}{% endfor %}",
]


@pytest.mark.parametrize("source", NO_OUTPUT_LOOPS)
def test_loops_and_calls_are_counted_steps(source, monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_RENDER_STEPS", 50_000)
    with pytest.raises(BadRequest) as e:
        ChatTemplate(source).render(MESSAGES * 1000)
    assert "more than 50000 loop iterations and calls" in str(e.value) and "\n" not in str(e.value)


def test_a_silent_nested_loop_stops_at_the_default_bounds():
    t0 = time.monotonic()
    with pytest.raises(BadRequest) as e:
        ChatTemplate(NO_OUTPUT_LOOPS[0]).render(MESSAGES * 3000)     # 2.7e10 iterations
    assert "went past its bounds" in str(e.value), str(e.value)
    assert time.monotonic() - t0 < MAX_RENDER_S + 10


def test_loop_semantics_survive_the_counting():
    t = ChatTemplate("{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}"
                     "{% if loop.last %}L{% endif %}{% else %}none{% endfor %}|"
                     "{% for m in tree recursive %}[{{ m.n }}{{ loop(m.c) }}]{% endfor %}|"
                     "{% for k in {'a': 1} %}{{ k }}{% endfor %}{% for i in [] %}x{% else %}E{% endfor %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "c"}]
    tree = [{"n": 1, "c": [{"n": 2, "c": []}]}, {"n": 3, "c": []}]
    assert t.render(msgs, extra={"tree": tree}) == "1/22/2L|[1[2]][3]|aE"


def test_ordinary_templates_render_as_before():
    t = ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] * 2 }}{{ 1 + 2 }}{{ 2 ** 10 }}"
                     "{{ '|' ~ m['role'] ~ 3 }}\n{% endfor %}{% for i in range(3) %}{{ i }}{% endfor %}")
    assert t.render(MESSAGES) == "user: hihi31024|user3\n012"
