#!/usr/bin/env bash
# One device call: engine GPU tests, 8B decode throughput, swap-heavy comparison (issues 2 and 4).
# Usage on the GPU machine (repo root): bash scripts/gpu_engine_run.sh OUTDIR
out=${1:-out}
mkdir -p "$out"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pytest -q -m gpu tests/engine/test_gpu_engine.py 2>&1 | tail -15
python3 -m hifc.entrypoints.cli bench decode --model random:ds-r1-llama-8b \
  --batch-sizes 1,16,64,128 --context 2048 --steps 32 --json "$out/decode_8b.json"
python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b \
  --profile govreport --num-prompts 24 --max-num-seqs 16 --kv-cache-gib 12 \
  --compare none,dram,flash,recompute --swap-space 10 \
  --flash-path "$PWD/hifc-swap.kv" --flash-size-gib 12 --no-progress \
  --json "$out/swap_govreport_8b.json"
rm -f "$PWD/hifc-swap.kv"
