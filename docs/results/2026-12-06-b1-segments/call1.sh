# device call 1: batch-1 decode steps at 4,096 keys with the attention split into 64 (the
# backend's plan, its merge kernel), 32 and 16 segments (16 merge in the launch), alternating
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/call1; rm -rf $D; mkdir -p $D; T0=$(date +%s); R=docs/results/2026-12-06-b1-segments
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, segments, merge rows
  local S=$(date +%s)
  timeout 90 python3 $R/var_b1.py $2 $3 bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1 --json $D/$1.json > $D/$1.txt 2>&1
  echo "$1 rc $? $(( $(date +%s) - S )) s: $(grep -E '^ +1 ' $D/$1.txt | head -1 | cut -c1-150)"
  tar -czf $OUT/call1.tgz -C /tmp call1
}
run s64a 0 0; run s16a 16 0; run s32a 32 128; run s64b 0 0; run s16b 16 0; run s32b 32 128; run s8 8 0
echo total $(( $(date +%s) - T0 )) s
