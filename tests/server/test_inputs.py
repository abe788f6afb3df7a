"""Request validation: good bodies become typed values, bad ones a one-line message naming the field."""

import pytest

from refengine.server.inputs import (BadRequest, parse_completion, parse_generate, parse_int_query,
                                     parse_internal_state, parse_json)


def test_generate_text_and_defaults():
    b = parse_generate({"text": "hi", "sampling_params": {"temperature": 0, "stop": "\n"}})
    (item,) = b.items
    assert not b.batch and not b.stream and item.text == "hi"
    assert item.sampling.max_new_tokens == 128 and item.sampling.stop == ("\n",)


def test_generate_batch_of_ids():
    b = parse_generate({"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 4}}, vocab_size=10)
    assert b.batch and [i.input_ids for i in b.items] == [(1, 2), (3,)]


@pytest.mark.parametrize("body, match", [
    ({}, "exactly one of text or input_ids"),
    ({"text": "a", "input_ids": [1]}, "exactly one"),
    ({"text": 5}, "text: expected"),
    ({"input_ids": [1, "x"]}, "input_ids"),
    ({"input_ids": [999]}, "outside the vocabulary"),
    ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"text": "a", "sampling_params": {"max_new_tokens": "3"}}, "max_new_tokens"),
    ({"text": "a", "sampling_params": {"temperature": -0.1}}, "temperature"),
    ({"text": "a", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"text": "a", "sampling_params": {"top_k": -5}}, "top_k"),
    ({"text": "a", "sampling_params": {"ignore_eos": "yes"}}, "ignore_eos"),
    ({"text": "a", "sampling_params": {"sampling_seed": -1}}, "sampling_seed"),
    ({"text": "a", "sampling_params": {"sampling_seed": 1.5}}, "sampling_seed"),
    ({"text": "a", "sampling_params": {"stop": [1]}}, "stop"),
    ({"text": "a", "sampling_params": [{}, {}]}, "one entry per prompt"),
    ({"text": ["a", "b"], "stream": True}, "streaming a batch"),
    ({"text": "a", "stream": "yes"}, "stream"),
    ([1, 2], "JSON object"),
    ({"text": "a", "return_logprob": True}, "return_logprob is not supported"),
])
def test_generate_refusals(body, match):
    with pytest.raises(BadRequest, match=match):
        parse_generate(body, vocab_size=100)


def test_malformed_json():
    with pytest.raises(BadRequest, match="malformed JSON"):
        parse_json(b"{nope")
    assert parse_json(b"") == {}


def test_completion_openai_defaults_and_extras():
    b = parse_completion({"prompt": "x", "return_spec_tokens_details": True, "temperature": 0})
    assert b.items[0].sampling.max_new_tokens == 16 and b.extras["return_spec_tokens_details"]
    assert parse_completion({"prompt": [1, 2], "max_tokens": 3}).items[0].input_ids == (1, 2)
    with pytest.raises(BadRequest, match="^n is not supported"):
        parse_completion({"prompt": "x", "n": 2})
    # protocol.py:448-453: SGLang's CompletionRequest refuses 0 as well as negatives.
    for bad in (0, -3):
        with pytest.raises(BadRequest, match="max_tokens must be positive") as e:
            parse_completion({"prompt": "x", "max_tokens": bad})
        assert e.value.err_type == "Bad Request"


# Every field SGLang serves and the engine ignores: (field, a value asking for it, its default).
IGNORED = [
    ("regex", "a+", None), ("json_schema", '{"type": "object"}', None), ("ebnf", "root ::= 'a'", None),
    ("frequency_penalty", 0.5, 0.0), ("presence_penalty", 0.5, 0.0), ("repetition_penalty", 1.2, 1.0),
    ("min_p", 0.1, 0.0), ("min_new_tokens", 4, 0), ("logit_bias", {"1": 5.0}, None), ("n", 2, 1),
    ("stop_regex", "x$", None), ("no_stop_trim", True, False), ("structural_tag", "{}", None),
    ("custom_params", {"a": 1}, None),
]


@pytest.mark.parametrize("name, value, default", IGNORED, ids=[f[0] for f in IGNORED])
def test_generate_refuses_what_it_would_ignore(name, value, default):
    with pytest.raises(BadRequest, match=f"^{name} is not supported by the reference engine"):
        parse_generate({"text": "a", "sampling_params": {name: value}})
    with pytest.raises(BadRequest, match=f"^{name} is not supported"):
        parse_generate({"text": ["a", "b"], "sampling_params": [{}, {name: value}]})
    parse_generate({"text": "a", "sampling_params": {name: default}})


COMPLETION_IGNORED = [f for f in IGNORED if f[0] not in ("min_new_tokens", "structural_tag", "custom_params")] + [
    ("min_tokens", 3, 0), ("response_format", {"type": "json_object"}, None), ("logprobs", 2, None),
    ("suffix", "end", None), ("best_of", 2, 1)]


@pytest.mark.parametrize("name, value, default", COMPLETION_IGNORED, ids=[f[0] for f in COMPLETION_IGNORED])
def test_completion_refuses_what_it_would_ignore(name, value, default):
    with pytest.raises(BadRequest, match=f"^{name} is not supported by the reference engine"):
        parse_completion({"prompt": "x", name: value})
    parse_completion({"prompt": "x", name: default})


def test_internal_state_shape_and_keys():
    assert parse_internal_state({"server_args": {"speculative_num_steps": 2.0}}) == {"speculative_num_steps": 2}
    assert parse_internal_state({"server_args": {"speculative_draft_placement": "rank0"}})
    with pytest.raises(BadRequest, match="Updating pp_max_micro_batch_size is not supported"):
        parse_internal_state({"server_args": {"pp_max_micro_batch_size": 2}})
    with pytest.raises(BadRequest, match="server_args"):
        parse_internal_state({"speculative_num_steps": 2})
    with pytest.raises(BadRequest, match="integer"):
        parse_internal_state({"server_args": {"speculative_num_steps": 2.5}})
    with pytest.raises(BadRequest, match="integer"):
        parse_internal_state({"server_args": {"speculative_num_steps": True}})


def test_query_ints():
    assert parse_int_query({"after": ["7"]}, "after", 0, -1, 100) == 7
    assert parse_int_query({}, "after", 3, -1, 100) == 3
    with pytest.raises(BadRequest, match="after"):
        parse_int_query({"after": ["x"]}, "after", 0, -1, 100)
    with pytest.raises(BadRequest, match="limit"):
        parse_int_query({"limit": ["0"]}, "limit", 1, 1, 10)


def test_sampling_seed_and_openai_seed():
    sp = parse_generate({"text": "a", "sampling_params": {"temperature": 1, "sampling_seed": 7}}).items[0].sampling
    assert (sp.temperature, sp.sampling_seed) == (1.0, 7)
    assert parse_generate({"text": "a"}).items[0].sampling.sampling_seed is None
    assert parse_completion({"prompt": "a", "seed": 3}).items[0].sampling.sampling_seed == 3
    with pytest.raises(BadRequest, match="seed"):
        parse_completion({"prompt": "a", "seed": "x"})


def test_a_per_request_acceptance_curve_for_the_simulator():
    b = parse_generate({"text": "x", "sampling_params": {"simulate_accept": [0.9, 0.5]}})
    assert b.items[0].sampling.simulate_accept == (0.9, 0.5)
    assert parse_generate({"text": "x"}).items[0].sampling.simulate_accept == ()
    for bad in ([1.5], "0.5", [True], [0.5] * 65):
        with pytest.raises(BadRequest, match=r"^simulate_accept: expected a list"):
            parse_generate({"text": "x", "sampling_params": {"simulate_accept": bad}})
