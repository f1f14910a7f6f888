python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/s8; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader); echo "$GPU" | tee $D/gpu.txt
run() {  # name, timeout, args...
  local name=$1 t=$2; shift 2
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-570} ]; then echo "$name skipped (time)"; return; fi
  S=$(date +%s); timeout $t python3 -m hifc.entrypoints.cli "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/s8.tgz -C /tmp s8; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^physical|^ +none|ideal" $D/$name.txt | cut -c1-160
}
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
run e8k_1 80 $E
run e16k_1 80 $E --max-num-batched-tokens 16384
run e8k_2 80 $E
run e16k_2 80 $E --max-num-batched-tokens 16384
run prof_b32 90 bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32 --profile
run prof_b1 90 bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1 --profile
echo total $(( $(date +%s) - T0 )) s
