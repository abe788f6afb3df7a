"""Fuzz tests (Hypothesis) for the two readers of server answers: the /metrics parser
(tuner.backends.promtext and what the deriver does with its result) and the /server_info reader
(tuner.backends.http.decode_json, detect_kind, common_info).

Each runs 10 000 examples under the `ci-fuzz` profile (derandomized, so a failure is the same on
every run), raises nothing but the reader's own error type, and keeps each example's peak traced
memory under 64 MB (tracemalloc)."""

from __future__ import annotations

import json
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.backends import detect_kind
from tuner.backends.common_info import common_info, launch_args, redact
from tuner.backends.derive import MetricsDeriver
from tuner.backends.http import BadAnswer, decode_json
from tuner.backends.promtext import MetricsParseError, parse_metrics, rank_info, tail_counts
from tuner.core.text import terminal_safe

settings.register_profile(
    "ci-fuzz", max_examples=10_000, derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
CI = settings.get_profile("ci-fuzz")
PEAK_LIMIT = 64 * 2**20

# /metrics bodies are drawn as sequences of fragments: cheap to generate (one list draw per
# example, so 10 000 examples fit the time budget) and rich in what breaks parsers: our and SGLang's
# names, label syntax, huge or odd label values, non-numbers, escapes, control characters.
FRAGMENTS = [
    "sglang:gen_throughput", "sglang:realtime_tokens_total", "sglang:spec_num_steps", "sglang:spec_accept_length",
    "specdecode:accept_position_total", "specdecode:phase_seconds_total", "specdecode:iterations_total",
    "specdecode:rank_info", "sglang:forward_execution_seconds_total", "x_bucket", "_total", "_count",
    "{", "}", ",", "=", '"', '\\"', "\\n", " ", "  ", "\t", "\n", "\n", "\n", "\r\n", "#", "# TYPE ", "# HELP ",
    " counter", " gauge", " histogram", " summary", " untyped", "# EOF",
    'k="', 'tp_rank="', 'rank="', 'phase="', 'mode="decode"', 'category="eagle_draft"', 'le="',
    "0", "1", "5", "20000000", "99999999999999999999", "-1", "1e308", "1e309", "-0", "NaN", "+Inf", "-Inf",
    "nan", "0x10", "1_000", "٣", "3.5", " 1700000000000", "\x00", "\x1b[2J", "\x1b]0;t\x07", "\x9b", "é", "\ufeff",
]
# One draw of bytes per example, each byte picking a fragment: Hypothesis's own cost per draw is what
# bounds 10 000 examples on 2 cores, so the bodies are built from a single draw.
METRICS_BODY = st.binary(max_size=48).map(lambda b: "".join(FRAGMENTS[x % len(FRAGMENTS)] for x in b))


def _bounded(fn) -> None:
    """Run fn under tracemalloc (only fn: generating examples is not traced, which keeps 10 000 of
    them within the time budget); its peak allocation stays under the limit."""
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.1f} MB"


def read_metrics(text: str) -> None:
    """What a poll does with a /metrics body: parse, then derive twice (rates need two scrapes)."""
    try:
        ms = parse_metrics(text)
    except MetricsParseError as e:
        assert "\n" not in str(e) and "\x1b" not in str(e)
        return
    tail = tail_counts(ms, "specdecode:accept_position_total")
    assert len(tail) <= 65
    rank_info(ms)
    d = MetricsDeriver()
    for t in (1.0, 2.0):
        for s in d.update(t, ms, {}):
            assert isinstance(s.value, float)


@CI
@given(st.one_of(METRICS_BODY, st.text(max_size=100)))
def test_fuzz_metrics_parser(text):
    _bounded(lambda: read_metrics(text))


SERVER_KEYS = ["version", "served_model_name", "model_path", "tp_size", "dp_size", "speculative_algorithm",
               "startup_time", "internal_states", "engine", "launch_command", "api_key", "admin_api_key",
               "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
               "speculative_draft_placement", "config_epoch", "emulated_comm", "simulated_accept"]
def _nest(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


# Values are drawn from a pool of hostile ones (wrong types, huge numbers, escapes, braces, secrets,
# nesting just under and over the limit) rather than generated recursively: cheap enough for 10 000.
POOL = [None, True, False, 0, 1, -1, 8, 2**70, -(2**63), 1.5, 1e308, "", "two", "0.5.23", "0.5.23-{build}",
        "{x}", "%s", "\x1b]0;PWNED\x07\x1b[2J", "\x9b31m", "é" * 50, "sharded", "nonsense",
        "--api-key K --port 1", "python -m sglang.launch_server --api-ke=K", [], [1, "a"], {}, {"x": 1},
        [{"speculative_num_steps": "3"}], [{"speculative_draft_placement": ["x"]}], _nest(63, 1), _nest(70, {}),
        {"message": "\x1b[2J"}]
N_FIELDS = len(SERVER_KEYS) * len(POOL)


def _fields(b: bytes) -> dict:
    """Two bytes per field pick its key and its value together."""
    out = {}
    for i in range(0, len(b) - 1, 2):
        n = (b[i] << 8 | b[i + 1]) % N_FIELDS
        out[SERVER_KEYS[n % len(SERVER_KEYS)]] = POOL[n // len(SERVER_KEYS)]
    return out


def build_server_info_body(b: bytes) -> bytes:
    """A /server_info body from one draw of bytes: raw bytes, deep nesting, or a JSON object of hostile
    fields (with internal_states), possibly cut and spliced."""
    if len(b) < 2:
        return b
    choice, rest = b[0] % 8, b[1:]
    if choice == 0:
        return rest
    if choice == 1:
        depth = 1 + (rest[0] * 12) % 3000
        return ('{"internal_states": ' + "[" * depth + "]" * depth + "}").encode()
    half = len(rest) // 2
    obj = _fields(rest[:half])
    if choice >= 4:
        obj["internal_states"] = [_fields(rest[half:])] if choice != 6 else [_fields(rest[half:]), 3]
    text = json.dumps(obj)
    if choice == 7:                # a cut with a splice: JSON that breaks somewhere
        cut = (rest[0] * 257 + rest[-1]) % (len(text) + 1)
        text = text[:cut] + ["", "}", "]", '"', "\\", "\x00", "é", "[" * 50][rest[-1] % 8]
    return text.encode("utf-8", "surrogatepass")


SERVER_INFO_BODY = st.binary(max_size=48).map(build_server_info_body)


def read_server_info(body: bytes) -> None:
    """What connect() and the /server_info poller do with a body."""
    try:
        raw = decode_json("/server_info", body)
    except BadAnswer as e:
        assert "\n" not in str(e)
        return
    if not isinstance(raw, dict):
        return                    # the backend says "not a JSON object" (BadAnswer)
    kind = detect_kind(raw) or detect_kind(raw, ["specdecode:x"]) or "sglang"
    info = common_info(kind, raw)
    for key in ("version", "model"):
        assert isinstance(info[key], str) and terminal_safe(info[key]) == info[key]
    assert info["tp_size"] is None or 1 <= info["tp_size"] <= 65536
    json.dumps(redact(launch_args(raw)), default=str)
    for v in info["active"].values():
        assert v is None or isinstance(v, (bool, int, float, str))


@CI
@given(SERVER_INFO_BODY)
def test_fuzz_server_info_reader(body):
    _bounded(lambda: read_server_info(body))
