#!/usr/bin/env bash
# CUDA graphs of decode steps on the GPU machine (repo root):
#   bash scripts/gpu_graph_check.sh OUTDIR [tests] [parity] [decode] [bench]   (default: all four)
# tests : pytest -m gpu on tests/runtime (graph replay = padded eager forward, graph vs eager
#         greedy parity, swaps with graphs, Triton plans fixed from max_model_len) and
#         tests/engine/test_gpu_engine.py (now running with graphs by default)
# parity: scripts/gpu_graph_check.py parity: graph vs eager greedy outputs, tiny presets fp32/bf16
#         and the 8B preset bf16 (exit 1 on any divergence, listed per request)
# decode: 8B preset, decode step times at batch 1/32/128 with 4k contexts, eager vs graph
# bench : hifc bench decode as in docs/RESULTS.md's eager table (context 2048), now with graphs
# All four take several minutes; if one device call's limit is short, run them in two calls
# (e.g. "tests parity", then "decode bench").
set -u -o pipefail
out=${1:-out}
shift || true
phases=${*:-tests parity decode bench}
mkdir -p "$out"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
status=0
for phase in $phases; do
  echo "=== $phase ($(date +%T))"
  case $phase in
    tests)
      python3 -m pytest -q -m gpu tests/runtime tests/engine/test_gpu_engine.py -rfE \
        2>&1 | tee "$out/graph_tests.txt" | tail -25 || status=1 ;;
    parity)
      python3 scripts/gpu_graph_check.py parity --json "$out/graph_parity.json" \
        2>&1 | tee "$out/graph_parity.txt" || status=1 ;;
    decode)
      python3 scripts/gpu_graph_check.py decode --batch-sizes 1,32,128 --context 4096 \
        --steps 32 --json "$out/graph_decode_8b.json" 2>&1 | tee "$out/graph_decode_8b.txt" \
        || status=1 ;;
    bench)
      python3 -m hifc.entrypoints.cli bench decode --model random:ds-r1-llama-8b \
        --batch-sizes 1,16,64,128 --context 2048 --steps 32 \
        --json "$out/decode_8b_graphs.json" 2>&1 | tail -8 || status=1 ;;
    *) echo "unknown phase $phase"; status=2 ;;
  esac
done
exit $status
