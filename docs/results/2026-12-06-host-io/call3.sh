python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/c3; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
run() {  # name, old|new, timeout, args...
  local name=$1 v=$2 t=$3; shift 3
  if [ $v = old ]; then cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  S=$(date +%s); timeout $t python3 -m hifc.entrypoints.cli "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/c3.tgz -C /tmp c3
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^physical|^ +none" $D/$name.txt | cut -c1-170
}
if grep -q H200 $D/gpu.txt; then
  K="bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,32"
  E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
  run new_k1 new 90 $K; run old_k1 old 90 $K; run old_k2 old 90 $K; run new_k2 new 90 $K
  run new_k3 new 90 $K; run old_k3 old 90 $K
  run new_e1 new 60 $E; run old_e1 old 60 $E
fi
export PYTHONPATH=/tmp/site:$ROOT; cd $ROOT
LEFT=$(( 575 - $(date +%s) + T0 ))
S=$(date +%s); timeout $LEFT python3 -m pytest -v -m gpu -p no:cacheprovider --ignore tests/server/test_server_openai.py --ignore tests/server/test_server_sampling.py --junitxml $D/suite.xml tests > $D/suite.txt 2>&1
echo "suite rc $? $(( $(date +%s) - S )) s (limit $LEFT)"; tail -4 $D/suite.txt; grep -cE "(PASSED|FAILED|SKIPPED|ERROR)" $D/suite.txt; grep -E "FAILED|ERROR" $D/suite.txt | head -20
tar -czf $OUT/c3.tgz -C /tmp c3
echo total $(( $(date +%s) - T0 )) s
