"""Chat templates rendered as Hugging Face renders them, which is what SGLang 0.5.23 sends to the model.

SGLang's rule: serving_chat.py:2322-2330 renders `tokenizer.apply_chat_template(messages,
tokenize=False, add_generation_prompt=...)` and encodes the text without adding special tokens
(:2180-2200). transformers' renderer (utils/chat_template_utils.py, `_compile_jinja_template`) is a
sandboxed, immutable jinja2 environment with trim_blocks/lstrip_blocks, loop controls, its own
`tojson`, `raise_exception` and `strftime_now`, and the special tokens as variables.

The real template is Llama-3.1-Instruct's (fixtures/llama31_chat_template.jinja, as published in
its tokenizer_config.json). transformers is the reference renderer where it is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refengine.data import TINY_TARGET_DIR
from refengine.server.chat_template import (PLAIN_TEMPLATE, ChatTemplate, ChatTemplateError,
                                            load_chat_template)
from refengine.server.inputs import BadRequest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LLAMA31 = (FIXTURES / "llama31_chat_template.jinja").read_text()
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there  "}],
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": 'Say <b>&</b> "quoted" é ✓'}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "tool_calls": [{"type": "function", "function": {
         "name": "calc", "arguments": {"expr": "2+2", "note": "<&>"}}}]},
     {"role": "tool", "content": "4"}],
]


def test_llama31_renders_metas_documented_prompt():
    """Meta's Llama 3.1 prompt format, written out: BOS, the system block with its date lines
    even without a system message, trimmed content, and the open assistant header."""
    text = ChatTemplate(LLAMA31, SPECIAL).render([{"role": "user", "content": "Hello there  "}])
    assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_llama31_equals_transformers(conv, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(TINY_TARGET_DIR / "tokenizer.json"),
                                               chat_template=LLAMA31, **SPECIAL)
    messages = CONVERSATIONS[conv]
    want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    got = ChatTemplate(LLAMA31, SPECIAL).render(messages, add_generation_prompt=add_generation_prompt)
    assert got == want


def test_tojson_keeps_html_characters():
    # transformers overrides jinja's tojson, which would write \u003c for "<" and change the prompt.
    text = ChatTemplate(LLAMA31, SPECIAL).render(CONVERSATIONS[2])
    assert '"parameters": {"expr": "2+2", "note": "<&>"}' in text


@pytest.mark.parametrize("messages, tools, message", [
    # The template's own refusals (raise_exception) are the client's 400, with the template's words.
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}}] * 2}], None,
     "This model only supports single tool-calls at once!"),
    ([{"role": "system", "content": "s"}], [{"type": "function"}],
     "Cannot put tools in the first user message when there's no first user message!"),
])
def test_raise_exception_is_a_bad_request(messages, tools, message):
    with pytest.raises(BadRequest, match="the chat template refused the messages: " + message.replace("!", "!")):
        ChatTemplate(LLAMA31, SPECIAL).render(messages, tools=tools)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",       # reach Python's classes
    "{% set x = messages.append({'role': 'x'}) %}",          # mutate the caller's data (immutable sandbox)
    "{{ messages[0].update({'role': 'x'}) }}",
])
def test_sandbox_refuses_escapes(source):
    with pytest.raises(BadRequest, match="refused"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_generation_tag_and_loop_controls_parse():
    src = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
           "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}")
    assert ChatTemplate(src).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a"


def test_syntax_error_is_a_load_error():
    with pytest.raises(ChatTemplateError, match="syntax error"):
        ChatTemplate("{% for %}")


def test_tiny_model_ships_the_plain_template():
    cfg = json.loads((TINY_TARGET_DIR / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == PLAIN_TEMPLATE
    t = load_chat_template(str(TINY_TARGET_DIR))
    assert t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]) == \
        "system: Be brief.\nuser: Hi\nassistant: "
    # bos_token is null in the tiny model's config: not passed, so the template sees it undefined.
    assert "bos_token" not in t.special_tokens and t.special_tokens["eos_token"] == "<|endoftext|>"


def test_load_reads_named_templates_and_added_token_dicts(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D"}],
    }))
    assert load_chat_template(str(tmp_path)).render([]) == "<s>D"


def test_load_falls_back_to_chat_template_jinja_then_plain(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert load_chat_template(str(tmp_path)).source == PLAIN_TEMPLATE
    (tmp_path / "chat_template.jinja").write_text("J")
    assert load_chat_template(str(tmp_path)).render([]) == "J"
    assert load_chat_template("tiny-agreeing").source == PLAIN_TEMPLATE  # a preset: no model directory


def test_broken_tokenizer_config_is_a_load_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json"):
        load_chat_template(str(tmp_path))
