python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/c2; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
run() {  # name, old|new, timeout, args...
  local name=$1 v=$2 t=$3; shift 3
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-570} ]; then echo "$name skipped (time)"; return; fi
  if [ $v = old ]; then cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  S=$(date +%s); timeout $t python3 -m hifc.entrypoints.cli "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/c2.tgz -C /tmp c2
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^physical|^ +none|^prefill|idle|Memcpy|load_packed|_store_kernel|compiled" $D/$name.txt | grep -v "x \[" | cut -c1-170
}
export PYTHONPATH=/tmp/site:$ROOT
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
K="bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,32,128 --max-model-len 131072"
run new_k1 new 100 $K
run old_k1 old 100 $K
run old_kp old 60 bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1 --profile
run new_kp new 60 bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1 --profile
run old_k2 old 100 $K
run new_k2 new 100 $K
run new_e3 new 60 $E
run old_e3 old 60 $E
echo total $(( $(date +%s) - T0 )) s
