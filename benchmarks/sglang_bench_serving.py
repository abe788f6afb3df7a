"""SGLang 0.5.23's own benchmark client (`python -m sglang.bench_serving`) against `serve`.

Starts `python -m refengine serve` (the shipped tiny model, TP 2 on CPU, --enable-metrics), then
runs SGLang's bench_serving once per backend (`sglang` = native /generate, `sglang-oai` =
/v1/completions, `sglang-oai-chat` = /v1/chat/completions), streaming, on random token ids with
a fixed input and output length, and checks that every request finished with the exact output
token count, three ways:
  client   bench_serving's own per-request output_lens, all == N, no errors. Only the native
           backend counts here (meta_info.completion_tokens); the OpenAI ones take `usage` from
           a chunk when there is one and otherwise keep the N they asked for, and a streamed
           reply carries no usage unless stream_options.include_usage is sent (SGLang's default)
  text     the generated texts re-tokenized with the model's tokenizer (byte-level), all == N
  server   the rise of `sglang:generation_tokens_total` / `num_requests_total` in serve's /metrics
           over the run == (prompts + warmup requests) x N / (prompts + warmup requests)

bench_serving runs in another interpreter (--sglang-python) holding the sglang wheel installed
without dependencies. Two of SGLang's imports are skipped there, both server runtime: the
top-level `sglang/__init__.py` (it imports the server and frontend stacks: torchvision,
tvm_ffi, ...) and `sglang.srt.disaggregation.utils`, imported by bench_serving for one string
constant, FAKE_BOOTSTRAP_HOST, whose value is read from the wheel's own source instead (it
imports every model config). Everything else is SGLang's code as shipped. The tokenizer is the
model's local directory (`--tokenizer`), so nothing is fetched from a model hub.

Usage: python benchmarks/sglang_bench_serving.py --sglang-python PY [--tp-size 2] [--prompts 16]
       [--input-len 32] [--output-len 24] [--concurrency 8] [--out RESULT.json]
Exit status 1 when a check fails. Speeds are printed as bench_serving prints them; nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

from tuner.engine_process import EngineProcess, EngineStartError  # noqa: E402

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")
TOKENIZER_DIR = ROOT / "refengine" / "data" / "tiny" / "target"
MODEL = "refengine-tiny"
WARMUP_REQUESTS = 1          # bench_serving's default; warmups ask for min(N, 32) tokens
# The tokenizer is local: a hub lookup (bench_serving's chat-template check on --model) must fail
# at once instead of retrying the network.
CLIENT_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

# Runs in the sglang interpreter: sys.argv[1:] are bench_serving's own arguments.
BOOTSTRAP = r"""
import ast, importlib.util, runpy, sys, types
spec = importlib.util.find_spec("sglang")
if spec is None:
    raise SystemExit("sglang is not installed in this interpreter")
root = list(spec.submodule_search_locations)[0]
pkg = types.ModuleType("sglang"); pkg.__path__ = [root]
sys.modules["sglang"] = pkg
src = open(root + "/srt/disaggregation/utils.py", encoding="utf-8").read()
value = next(n.value.value for n in ast.parse(src).body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", None) == "FAKE_BOOTSTRAP_HOST" for t in n.targets))
dis = types.ModuleType("sglang.srt.disaggregation.utils"); dis.FAKE_BOOTSTRAP_HOST = value
sys.modules[dis.__name__] = dis
runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
"""


def probe(python: str) -> str | None:
    """None when `python` can run SGLang's bench_serving this way, else the reason (one line)."""
    try:
        out = subprocess.run([python, "-c", BOOTSTRAP, "--help"], capture_output=True, text=True,
                             timeout=600, env=CLIENT_ENV)
    except OSError as e:
        return f"cannot run {python}: {e}"
    if out.returncode == 0 and "--backend" in out.stdout:
        return None
    lines = (out.stderr or out.stdout).strip().splitlines() or ["no output"]
    return lines[-1]


def counters(base: str) -> dict[str, float]:
    """Sums over all label sets of serve's request and generated-token counters."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=60).text
    out = {"generation_tokens": 0.0, "requests": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sglang:generation_tokens_total":
                out["generation_tokens"] += s.value
            elif s.name == "sglang:num_requests_total":
                out["requests"] += s.value
    return out


def bench_argv(backend: str, base: str, a: argparse.Namespace, out_file: Path) -> list[str]:
    return ["--backend", backend, "--base-url", base, "--model", MODEL,
            "--tokenizer", str(TOKENIZER_DIR), "--dataset-name", "random-ids",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--random-range-ratio", "1", "--num-prompts", str(a.prompts),
            "--max-concurrency", str(a.concurrency), "--warmup-requests", str(WARMUP_REQUESTS),
            "--seed", "1", "--disable-tqdm", "--output-file", str(out_file), "--output-details"]


def run_backend(python: str, backend: str, base: str, a: argparse.Namespace, tmp: Path,
                tokenizer) -> dict:
    before = counters(base)
    out_file = tmp / f"{backend}.jsonl"
    argv = bench_argv(backend, base, a, out_file)
    proc = subprocess.run([python, "-c", BOOTSTRAP, *argv], capture_output=True, text=True,
                          timeout=1800, cwd=tmp, env=CLIENT_ENV)
    after = counters(base)
    row: dict = {"backend": backend, "exit_status": proc.returncode}
    if proc.returncode != 0 or not out_file.exists():
        row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        row["ok"] = False
        return row
    res = json.loads(out_file.read_text().strip().splitlines()[-1])
    n, total = a.output_len, a.prompts + WARMUP_REQUESTS
    retok = [len(tokenizer.encode(t, add_special_tokens=False)) for t in res["generated_texts"]]
    row.update({
        "completed": res["completed"], "errors": sum(1 for e in res["errors"] if e),
        "client_output_lens": sorted(set(res["output_lens"])),
        "retokenized_output_lens": sorted(set(retok)),
        "server_generation_tokens": after["generation_tokens"] - before["generation_tokens"],
        "server_requests": after["requests"] - before["requests"],
        "expected_server_generation_tokens": total * n, "expected_server_requests": total,
        "duration_s": res["duration"], "output_throughput": res["output_throughput"],
        "median_ttft_ms": res["median_ttft_ms"], "median_itl_ms": res["median_itl_ms"],
        "accept_length": res.get("accept_length"),
    })
    row["ok"] = (row["completed"] == a.prompts and row["errors"] == 0
                 and row["client_output_lens"] == [n] and row["retokenized_output_lens"] == [n]
                 and row["server_generation_tokens"] == total * n
                 and row["server_requests"] == total)
    return row


class _Tokenizer:
    """The model's own tokenizer file (byte-level), read with `tokenizers`."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer

        self.t = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.t.encode(text, add_special_tokens=add_special_tokens).ids


def run_against(python: str, base: str, a: argparse.Namespace) -> dict:
    """Every backend in turn against the server at `base` (nothing else may use it meanwhile:
    the server-side check reads its counters)."""
    rows = []
    tokenizer = _Tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in a.backends.split(","):
            rows.append(run_backend(python, backend, base, a, Path(tmp), tokenizer))
    return {"sglang": "0.5.23", "prompts": a.prompts, "input_len": a.input_len,
            "output_len": a.output_len, "concurrency": a.concurrency,
            "warmup_requests": WARMUP_REQUESTS, "backends": rows, "ok": all(r["ok"] for r in rows)}


def run(python: str, a: argparse.Namespace) -> dict:
    try:
        engine = EngineProcess.start(["--port", "0", "--tp-size", str(a.tp_size), "--enable-metrics",
                                      *a.serve_arg], env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                     timeout_s=600, cwd=ROOT)
    except EngineStartError as e:
        raise SystemExit(str(e)) from None
    try:
        result = run_against(python, engine.url, a)
    finally:
        engine.stop(timeout=60)
    return {**result, "serve": {"tp_size": a.tp_size, "args": a.serve_arg}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-python", required=True,
                    help="an interpreter with sglang==0.5.23 installed without dependencies")
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    a = ap.parse_args(argv)
    if a.output_len > 32:
        # bench_serving's warmup asks for min(N, 32) tokens: the server-side count assumes N.
        ap.error("--output-len must be at most 32")
    return a


def main() -> int:
    a = parse_args()
    why = probe(a.sglang_python)
    if why is not None:
        print(f"cannot run sglang.bench_serving with {a.sglang_python}: {why}", file=sys.stderr)
        return 2
    result = run(a.sglang_python, a)
    for r in result["backends"]:
        if "error" in r:
            print(f"{r['backend']:16s} FAILED: {r['error']}")
            continue
        print(f"{r['backend']:16s} {'ok' if r['ok'] else 'MISMATCH'}: {r['completed']}/{result['prompts']} "
              f"completed, {r['errors']} errors, output lens client {r['client_output_lens']} "
              f"re-tokenized {r['retokenized_output_lens']}, server +{r['server_generation_tokens']:.0f} "
              f"tokens / +{r['server_requests']:.0f} requests (expected "
              f"{r['expected_server_generation_tokens']} / {r['expected_server_requests']}); "
              f"{r['output_throughput']:.1f} out tok/s, median TTFT {r['median_ttft_ms']:.0f} ms")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
