#!/usr/bin/env bash
# A recording of a live GPU server, for the example report and the analyser comparison: `serve`
# (8B-shaped preset, bf16, CUDA graphs, TP2, acceptance simulated on vLLM's published Llama-3.1-8B
# EAGLE-3 curve) under 4 streaming requests, recorded headless with NVML, the phase stream and a
# profiler trace of every rank every 20 s, with live changes of placement and steps on the way.
#
#   bash benchmarks/gpu_record.sh OUT_DIR [SECONDS]
#   DEVICE=cpu MODEL=tiny-agreeing DTYPE=float32 bash benchmarks/gpu_record.sh OUT_DIR 30   (CPU check)
#
# Writes OUT_DIR/gpu_record.sqlite (the recording: traces included), OUT_DIR/gpu_record.log (the
# recorder's progress) and OUT_DIR/gpu_serve.log. Then, anywhere:
#   specdecode-tune report OUT_DIR/gpu_record.sqlite -o report.html
set -u
out=${1:?usage: gpu_record.sh OUT_DIR [SECONDS]}
secs=${2:-75}
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} PYTHONUNBUFFERED=1
port=${PORT:-30123}
python3 -m refengine serve --device "${DEVICE:-cuda}" --tp-size 2 --model-path "${MODEL:-llama-3.1-8b}" \
    --load-format dummy --dtype "${DTYPE:-bfloat16}" --port "$port" --context-length 4096 --max-running-requests 8 \
    --speculative-num-steps 3 --speculative-simulate-accept 0.8,0.7,0.7679,0.6744,0.8276,0.5833,0.5714 \
    >"$out/gpu_serve.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null' EXIT
for _ in $(seq 300); do
    python3 - "$port" <<'EOF' && break
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
except Exception:
    sys.exit(1)
EOF
    kill -0 $srv 2>/dev/null || { echo "serve died:"; tail -20 "$out/gpu_serve.log"; exit 1; }
    sleep 1
done
third=$((secs / 3))
python3 -m tuner record "http://127.0.0.1:$port" --out "$out/gpu_record.sqlite" --overwrite \
    --duration "${secs}s" --load 4 --max-new-tokens 512 --capture-trace-every 20s --capture-steps 5 \
    --set-at "${third}s:speculative_draft_placement=replicated" \
    --set-at "$((2 * third))s:speculative_num_steps=5" --progress-every 10s 2>&1 | tee "$out/gpu_record.log"
