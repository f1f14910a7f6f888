#!/usr/bin/env bash
# A third-party load tester against `hifc serve`: NVIDIA's aiperf (0.13, pip install aiperf)
# sends streaming chat requests with vLLM's ignore_eos and min_tokens, the way its docs
# recommend for fixed output lengths, and must record zero errors.
#
# usage: scripts/aiperf_smoke.sh [OUTDIR]
#   AIPERF=path/to/aiperf (default: aiperf on PATH; install it in a venv of its own, it pins
#   many packages), PYTHON=python with hifc (default python3), MODEL (default smollm2-135m),
#   DEVICE (default cpu), REQUESTS (default 8), CONCURRENCY (default 2), OSL (default 16).
# Serves the model on a free loopback port, runs aiperf, checks its JSON export, stops the
# server. Exit status 0 only if every request completed without error.
set -euo pipefail

OUT=${1:-$(mktemp -d /tmp/hifc-aiperf.XXXXXX)}
AIPERF=${AIPERF:-aiperf}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-smollm2-135m}
DEVICE=${DEVICE:-cpu}
REQUESTS=${REQUESTS:-8}
CONCURRENCY=${CONCURRENCY:-2}
OSL=${OSL:-16}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# aiperf counts tokens with the model's tokenizer: a Hugging Face model directory has it; a
# GGUF's (or the smollm2-135m alias's) is saved as one
if [ -d "$MODEL" ]; then
    TOKENIZER=$MODEL
else
    TOKENIZER=$OUT/tokenizer
    "$PYTHON" - "$MODEL" "$TOKENIZER" <<'EOF'
import sys
from pathlib import Path
from hifc.loader import ALIASES
from hifc.loader.tokenizer import Tokenizer
model = sys.argv[1]
path = ALIASES[model]() if model in ALIASES else Path(model)
Tokenizer.from_gguf(path).hf_tokenizer.save_pretrained(sys.argv[2])
EOF
fi

PORT=$("$PYTHON" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$PYTHON" -m hifc.entrypoints.cli serve "$MODEL" --device "$DEVICE" --port "$PORT" \
    --max-model-len 512 > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $SERVER 2>/dev/null || { cat "$OUT/server.log"; exit 1; }
    sleep 1
done

# aiperf loads a local tokenizer path only when Hugging Face offline mode is off (with it on,
# it looks the path up in the hub cache); the path never reaches the network either way.
START=$(date +%s)
env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE "$AIPERF" profile --model "$MODEL" \
    --tokenizer "$TOKENIZER" --url "http://127.0.0.1:$PORT" --endpoint-type chat \
    --streaming --request-count "$REQUESTS" --concurrency "$CONCURRENCY" \
    --synthetic-input-tokens-mean 32 --output-tokens-mean "$OSL" \
    --extra-inputs ignore_eos:true --extra-inputs "min_tokens:$OSL" \
    --ui none --workers-max 1 --artifact-dir "$OUT/aiperf" > "$OUT/aiperf.log" 2>&1 \
    || { tail -40 "$OUT/aiperf.log"; exit 1; }
echo "aiperf ran in $(( $(date +%s) - START )) s; artifacts in $OUT/aiperf"

"$PYTHON" - "$OUT/aiperf/profile_export_aiperf.json" "$REQUESTS" "$OSL" <<'EOF'
import json, sys
report, requests, osl = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
completed = report["completed_request_count"]["avg"]
errors = report["error_summary"]
usage = report["usage_completion_tokens"]
print(f"requests {requests}, completed {completed:.0f}, errors {len(errors)}, "
      f"completion tokens (server) min {usage['min']:.0f} max {usage['max']:.0f}, "
      f"TTFT p50 {report['time_to_first_token']['p50']:.0f} ms, "
      f"request latency p50 {report['request_latency']['p50']:.0f} ms")
ok = completed == requests and not errors and usage["min"] == usage["max"] == osl
print("OK" if ok else f"FAILED: {errors}")
sys.exit(0 if ok else 1)
EOF
