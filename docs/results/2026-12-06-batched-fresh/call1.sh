# device call 1: fresh prompt chunks of one padded length in one batched cuDNN call (probe.py);
# the dense-path GPU tests; end to end, main (devrun/base: a `git archive` of main's hifc/) against
# the batched calls (the working tree), alternating
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
ROOT=$PWD; D=$OUT/call1; mkdir -p $D; T0=$(date +%s); R=docs/results/2026-12-06-batched-fresh
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$ROOT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
timeout 150 python3 $R/probe.py $D/probe.json > $D/probe.txt 2>&1
echo "probe rc $? $(( $(date +%s) - T0 )) s"; cut -c1-330 $D/probe.txt
S=$(date +%s); timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_attention.py -k "dense or fresh or warm or fused or padded or densely or batches" > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt
run() {  # name, variant (base | new), args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  if [ $v = new ]; then cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; else cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; fi
  timeout 80 python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name rc $? $(( $(date +%s) - S )) s"; grep -E "^ +none|ideal|fused prompt|Error|error" $D/$name.txt | cut -c1-220 | head -4; cd $ROOT
}
E="--input-len 1024 --output-len 128 --num-prompts 32"
run e_base1 base $E; run e_new1 new $E; run e_base2 base $E; run e_new2 new $E
run g_new new --profile govreport --num-prompts 32
[ $(( $(date +%s) - T0 )) -lt 520 ] && run g_base base --profile govreport --num-prompts 32
echo total $(( $(date +%s) - T0 )) s
