python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/c5; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
run() {  # name, old|new, timeout, args...
  local name=$1 v=$2 t=$3; shift 3
  if [ $v = old ]; then cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  S=$(date +%s); timeout $t python3 -m hifc.entrypoints.cli "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/c5.tgz -C /tmp c5
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^physical|^ +none" $D/$name.txt | cut -c1-170
}
K="bench kernels --context 4096 --prefill-len 512 --steps 96 --batch-sizes 1"
run new_b1 new 60 $K; run old_b1 old 60 $K; run new_b2 new 60 $K; run old_b2 old 60 $K
echo total $(( $(date +%s) - T0 )) s
