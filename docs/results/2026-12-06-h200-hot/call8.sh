python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/c6; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
run() {  # name, old|new, timeout, args...
  local name=$1 v=$2 t=$3; shift 3
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-560} ]; then echo "$name skipped (time)"; return; fi
  if [ $v = old ]; then cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  S=$(date +%s); timeout $t python3 -m hifc.entrypoints.cli "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/c6.tgz -C /tmp c6
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^physical|^ +none|^prefill|tuned the|x \[" $D/$name.txt | cut -c1-170
}
export PYTHONPATH=/tmp/site:$ROOT
true
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -3 $D/tests.txt
P="bench kernels --context 1024 --prefill-len 8192 --steps 16 --batch-sizes 32"
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
run old_e1 old 80 $E
run new_e1 new 80 $E
run new_e2 new 80 $E
run old_e2 old 80 $E
run old_e3 old 80 $E
run new_e3 new 80 $E
exit
run old_p old 100 $P
run old_e1 old 80 $E
run new_e1 new 80 $E
run old_e2 old 80 $E
run new_e2 new 80 $E
run new_e3 new 80 $E
run old_e3 old 80 $E
echo total $(( $(date +%s) - T0 )) s
