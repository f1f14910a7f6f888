#!/usr/bin/env bash
# One device call: GPU engine tests, then swap comparisons of the 8B preset (issue 4):
# GovReport-like inputs, and a fixed 2k-in / 1k-out workload whose growth forces many swaps.
# Usage on the GPU machine (repo root): bash scripts/gpu_swap_run.sh OUTDIR
out=${1:-out}
mkdir -p "$out"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python3 -m pytest -q -m gpu tests/engine/test_gpu_engine.py 2>&1 | tail -3
common=(--model random:ds-r1-llama-8b --compare none,dram,flash,recompute --no-progress
        --flash-path "$PWD/hifc-swap.kv")
python3 -m hifc.entrypoints.cli bench throughput "${common[@]}" --profile govreport \
  --num-prompts 24 --max-num-seqs 16 --kv-cache-gib 12 --swap-space 10 --flash-size-gib 12 \
  --json "$out/swap_govreport_8b.json"
python3 -m hifc.entrypoints.cli bench throughput "${common[@]}" --input-len 2048 \
  --output-len 1024 --num-prompts 32 --max-num-seqs 32 --kv-cache-gib 5 --swap-space 8 \
  --flash-size-gib 8 --json "$out/swap_fixed2k_8b.json"
rm -f "$PWD/hifc-swap.kv"
