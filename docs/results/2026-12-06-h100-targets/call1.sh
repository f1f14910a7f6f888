#!/usr/bin/env bash
# The decode plans the batch-1/2 change (8cb031e) moved and no GPU had run: the 8B's batch 1 and
# 2 past 4,096 keys (32 segments where 64 were), the 32B's batch 4 (16 segments, now merged in
# the launch). New: the working tree's hifc/; base: 93a06d7's, from devrun/base. Repo root.
set -uo pipefail
out=${1:?OUTDIR}  # every run's JSON and log go to OUTDIR/runs.tar at the end
tmp=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv
run() {  # variant name args...
  local dir=$PWD; [ "$1" = base ] && dir=$PWD/devrun/base
  local name=$2; shift 2
  PYTHONPATH=$dir:${PYTHONPATH:-} python3 -m hifc.entrypoints.cli bench kernels "$@" \
    --json "$tmp/$name.json" > "$tmp/$name.log" 2>&1 || echo "$name FAILED"
  grep -E "^(model| +batch| +[0-9]+ )" "$tmp/$name.log"
  mkdir -p "$out" && tar -C "$tmp" -cf "$out/runs.tar" .  # after each run: a timeout keeps the rest
}
b8=(--context 32768 --prefill-len 512 --steps 32 --batch-sizes 1,2)
b32=(--model random:ds-r1-qwen-32b --context 4096 --prefill-len 512 --steps 32 --batch-sizes 4
     --kv-cache-gib 5.5)
i=0
for v in new base new base; do i=$((i + 1)); echo "== 8B $v"; run $v "8b-$i-$v" "${b8[@]}"; done
for v in new base; do i=$((i + 1)); echo "== 32B $v"; run $v "32b-$i-$v" "${b32[@]}"; done
