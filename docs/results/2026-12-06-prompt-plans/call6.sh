python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/c6; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, variant (base: main's hifc from devrun/base | tma: the working tree), args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  if [ $v = tma ]; then cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; else cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; fi
  timeout ${TL:-80} python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT
  grep -E "started up|^ +none|Error|error" $D/$name.txt | cut -c1-200 | head -4
  python3 -c "import json,sys; d=json.load(open('$D/$name.json'))['variants'][0]; print('  compiles in run:', len(d['kernel_compiles']))" 2>/dev/null
  tar -czf $OUT/c6.tgz -C /tmp c6
}
export PYTHONPATH=/tmp/site:$ROOT
S=$(date +%s); timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_prompt_attention.py tests/layers/test_triton_attention.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt
tar -czf $OUT/c6.tgz -C /tmp c6
if [ $(( $(date +%s) - T0 )) -lt 200 ]; then
TL=60 run g_tma1 tma --profile govreport --num-prompts 32
TL=45 run g_base1 base --profile govreport --num-prompts 32
fi
echo total $(( $(date +%s) - T0 )) s
