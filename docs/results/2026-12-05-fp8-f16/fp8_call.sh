#!/bin/bash
# fp8 attention in float16: GPU tests, then bench kernels fp8 new/old and bf16 new
export PYTHONUNBUFFERED=1
ROOT=$PWD
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv
PYTHONPATH=/tmp/site:$ROOT timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/layers/test_triton_attention.py tests/engine/test_fp8_kv.py tests/layers/test_triton_compile_fp8.py tests/runtime/test_decode_graphs_triton.py 2>&1 | tail -8
PYTHONPATH=/tmp/site:$ROOT timeout 60 python3 devrun/fp8_err.py new 2>&1 | tail -4
PYTHONPATH=$ROOT/devrun/old:/tmp/site:$ROOT timeout 60 python3 devrun/fp8_err.py old 2>&1 | tail -4
run() {  # label code dtype
  local P=/tmp/site:$ROOT
  [ "$2" = old ] && P=$ROOT/devrun/old:/tmp/site:$ROOT
  (cd /tmp && PYTHONPATH=$P timeout 150 python3 -m hifc.entrypoints.cli bench kernels \
     --batch-sizes 1,32,128 --context 4096 --prefill-len 512 --kv-cache-dtype $3 \
     --json $OUT/k-$1.json > $OUT/k-$1.txt 2>&1)
  echo "== $1 rc=$?"; grep -v "^\s*$" $OUT/k-$1.txt | tail -8
}
run fp8-new new fp8
run fp8-old old fp8
run bf16-new new auto
run fp8-new2 new fp8
