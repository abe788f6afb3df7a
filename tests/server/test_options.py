"""`serve` flags: SGLang's names, defaults, and the refusals that protect the operator."""

import pytest

from refengine.server.options import OptionsError, is_loopback, parse_options, redact_argv


def test_defaults_mirror_sglang():
    o = parse_options([])
    assert (o.host, o.port, o.decode_log_interval, o.tp_size) == ("127.0.0.1", 30000, 40, 1)
    assert o.enable_metrics and o.speculative and o.speculative_draft_placement == "sharded"


def test_sglang_flag_names_parse():
    o = parse_options(["--model-path", "tiny", "--load-format", "dummy", "--speculative-algorithm", "eagle",
                       "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "3", "--speculative-draft-placement", "rank0",
                       "--tp-size", "2", "--max-running-requests", "4", "--enable-metrics",
                       "--decode-log-interval", "5", "--emulate-comm-latency", "50,2"])
    assert o.speculative_algorithm == "EAGLE3" and o.speculative_num_steps == 2
    assert o.speculative_draft_placement == "rank0" and o.tp_size == 2 and o.max_running_requests == 4
    assert parse_options(["--speculative-algorithm", "NONE"]).speculative is False


def test_non_loopback_without_key_is_refused():
    with pytest.raises(OptionsError, match="without --api-key"):
        parse_options(["--host", "0.0.0.0"])
    assert parse_options(["--host", "0.0.0.0", "--api-key", "k"]).host == "0.0.0.0"
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.0.0.1")


@pytest.mark.parametrize("argv, match", [
    (["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "5"], "steps\\+1 = 4"),
    (["--emulate-comm-latency", "fast"], "not a number"),
    (["--emulate-comm-latency", "-5"], ">= 0"),
    (["--speculative-algorithm", "NGRAM"], "not supported"),
])
def test_bad_combinations(argv, match):
    with pytest.raises(OptionsError, match=match):
        parse_options(argv)


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--tp-size", "0"], ["--speculative-num-steps", "-1"],
                                  ["--speculative-draft-placement", "everywhere"]])
def test_bad_values_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_options(argv)
    assert e.value.code == 2 and "error" in capsys.readouterr().err


def test_api_key_never_shown():
    o = parse_options(["--api-key", "s3cret", "--host", "0.0.0.0"])
    d = o.resolved_dict()
    assert "s3cret" not in str(d) and d["api_key"] == "<redacted>"
    assert redact_argv(["--api-key=abc", "x"]) == "--api-key=<redacted> x"


def test_engine_options_mapping():
    from refengine.server.app import default_model, engine_options

    e = engine_options(parse_options(["--tp-size", "2", "--dtype", "half", "--speculative-num-steps", "2",
                                      "--max-running-requests", "3", "--context-length", "512"]))
    assert (e.tp_size, e.dtype, e.speculative_num_steps, e.max_running_requests, e.context_length) == \
        (2, "float16", 2, 3, 512)
    assert e.model_path == default_model()["model_path"]  # the shipped tiny model, else the preset
    assert engine_options(parse_options(["--speculative-algorithm", "NONE"])).speculative_num_steps == 0
    p = engine_options(parse_options(["--model-path", "tiny", "--load-format", "dummy"]))
    assert (p.model_path, p.load_format) == ("tiny", "dummy")


def test_disable_cuda_graph_maps_to_the_engine():
    from refengine.server.app import engine_options

    assert engine_options(parse_options([])).cuda_graph == "auto"
    assert engine_options(parse_options(["--disable-cuda-graph"])).cuda_graph == "off"
    assert engine_options(parse_options(["--cuda-graph-mode", "static"])).cuda_graph == "static"
    assert engine_options(parse_options([])).cuda_graph_max_graphs == 64
    assert engine_options(parse_options(["--cuda-graph-max-graphs", "512"])).cuda_graph_max_graphs == 512
    with pytest.raises(SystemExit):
        parse_options(["--cuda-graph-max-graphs", "0"])


def test_the_shipped_model_is_reported_without_machine_directories(tmp_path):
    from refengine.data import TINY_DRAFT_DIR, TINY_TARGET_DIR
    from refengine.server.app import shown_path

    assert shown_path(str(TINY_TARGET_DIR)) == "refengine/data/tiny/target"
    assert shown_path(str(TINY_DRAFT_DIR)) == "refengine/data/tiny/eagle3"
    assert shown_path(str(tmp_path)) == str(tmp_path)   # a user's own path stays as given
    assert shown_path("tiny") == "tiny" and shown_path(None) is None


def test_the_kernel_switches_in_the_environment_are_checked_before_any_rank_starts(monkeypatch):
    from refengine.config import fused_kernels_from

    every = {"silu_mul", "add_rms_norm", "rope_store"}
    assert fused_kernels_from(None) == every and fused_kernels_from("all") == every    # unset: all, as measured
    assert fused_kernels_from("") == set() and fused_kernels_from("none") == set()
    assert fused_kernels_from(" silu_mul, rope_store ") == {"silu_mul", "rope_store"}
    monkeypatch.setenv("SPECDECODE_FUSED_KERNELS", "silu,rope_store")
    with pytest.raises(OptionsError, match=r"^\$SPECDECODE_FUSED_KERNELS: unknown kernel\(s\) silu; known: "):
        parse_options([])
    monkeypatch.setenv("SPECDECODE_FUSED_KERNELS", "all")
    monkeypatch.setenv("SPECDECODE_ATTEND_SKIP_HIDDEN", "yes")
    with pytest.raises(OptionsError, match=r"SPECDECODE_ATTEND_SKIP_HIDDEN: expected 1 or 0, got 'yes'"):
        parse_options([])
    monkeypatch.setenv("SPECDECODE_ATTEND_SKIP_HIDDEN", "1")
    parse_options([])


def test_chunked_prefill_flags_map_to_the_engine():
    """SGLang's --chunked-prefill-size (-1: no chunking; unset: 8192 on an H200, 4096 without a
    GPU) and --max-prefill-tokens (16384)."""
    from refengine.server.app import engine_options

    e = engine_options(parse_options([]))
    assert (e.chunk_size(), e.max_prefill_tokens) == (4096, 16384)
    assert engine_options(parse_options(["--device", "cuda"])).chunk_size() == 8192
    e = engine_options(parse_options(["--chunked-prefill-size", "-1", "--max-prefill-tokens", "512"]))
    assert (e.chunk_size(), e.max_prefill_tokens) == (-1, 512)
    assert engine_options(parse_options(["--chunked-prefill-size", "64"])).chunk_size() == 64
    for bad in ("0", "-2"):
        with pytest.raises(SystemExit):
            parse_options(["--chunked-prefill-size", bad])
