python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/s2; mkdir -p $D; ROOT=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
S=$(date +%s)
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_gemv.py tests/layers/test_linear.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -3 $D/tests.txt
run() {  # name, old|new, args...
  local name=$1 v=$2; shift 2
  if [ $v = old ]; then cd $ROOT/devrun/old; export PYTHONPATH=/tmp/site:$ROOT/devrun/old; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  S=$(date +%s); timeout 60 python3 -m hifc.entrypoints.cli "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/s2.tgz -C /tmp s2; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model|^physical|^ +none" $D/$name.txt | cut -c1-160
}
A="bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 4,16,32"
B="bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
run new_a new $A
run old_a old $A
run new_b new $B
run old_b old $B
run new_e new $E
run old_e old $E
