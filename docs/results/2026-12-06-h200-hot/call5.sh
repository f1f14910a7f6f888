python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/s7; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader); echo "$GPU" | tee $D/gpu.txt
run() {  # name, old|new, timeout, args...
  local name=$1 v=$2 t=$3; shift 3
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-570} ]; then echo "$name skipped (time)"; return; fi
  local cmd="-m hifc.entrypoints.cli"
  if [ $v = old ]; then cd $ROOT/devrun/old; export PYTHONPATH=/tmp/site:$ROOT/devrun/old; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  if [ $v = lt ]; then cmd="devrun/swap/var2.py lt_narrow"; fi
  S=$(date +%s); timeout $t python3 $cmd "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/s7.tgz -C /tmp s7; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model|^physical|^ +none|ideal" $D/$name.txt | cut -c1-160
}
A="bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 4,16,32"
B="bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
Q="bench kernels --model random:ds-r1-qwen-32b --context 1536 --prefill-len 512 --steps 32 --batch-sizes 32,128"
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
run new_a new 70 $A
run old_a old 70 $A
run new_b new 60 $B
run old_b old 60 $B
if [ $(( $(date +%s) - T0 + 170 )) -lt ${LIMIT:-570} ]; then
S=$(date +%s)
cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_gemv.py tests/layers/test_linear.py tests/runtime/test_decode_graphs_gpu.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -3 $D/tests.txt; tar -czf $OUT/s7.tgz -C /tmp s7
fi
case "$GPU" in *H200*) run new_q new 90 $Q; run old_q old 90 $Q;; esac
run new_e new 70 $E
run old_e old 70 $E
run new_a2 new 70 $A
case "$GPU" in *H100*) run new_q16 new 90 bench kernels --model random:ds-r1-qwen-32b --context 1024 --prefill-len 512 --steps 32 --batch-sizes 16 --kv-cache-gib 5.5; run old_q16 old 90 bench kernels --model random:ds-r1-qwen-32b --context 1024 --prefill-len 512 --steps 32 --batch-sizes 16 --kv-cache-gib 5.5;; esac
case "$GPU" in *H200*) run new_b2 new 60 $B; run new_q2 new 90 $Q;; esac
echo total $(( $(date +%s) - T0 )) s
