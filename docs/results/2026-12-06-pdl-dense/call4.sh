python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/b4; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, variant (base|dense), args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  if [ $v = base ]; then cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; else cd $ROOT/devrun/$v; export PYTHONPATH=/tmp/site:$ROOT/devrun/$v; fi
  timeout ${TL:-90} python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT
  grep -E "started up|fused prompt|^ +none|Error|error" $D/$name.txt | cut -c1-230 | head -6
  tar -czf $OUT/b4.tgz -C /tmp b4
}
E="--input-len 1024 --output-len 128 --num-prompts 32"
run e_base1 base $E
run e_dense1 dense $E
TL=100 run g_dense1 dense --profile govreport --num-prompts 32
TL=100 run g_base1 base --profile govreport --num-prompts 32
cd $ROOT/devrun/dense; export PYTHONPATH=/tmp/site:$ROOT/devrun/dense
S=$(date +%s); timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_attention.py tests/runtime/test_warm_up.py -k "dense or fresh or warm or fused or padded or densely" > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt
tar -czf $OUT/b4.tgz -C /tmp b4
echo total $(( $(date +%s) - T0 )) s
