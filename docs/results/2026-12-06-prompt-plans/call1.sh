python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
P=docs/results/2026-12-06-prompt-plans
D=/tmp/c1; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 240 python3 $P/probe.py $D/probe.json > $D/probe.txt 2>&1; echo "probe rc $? $(( $(date +%s) - S )) s"
grep -v Warning $D/probe.txt | tail -70
S=$(date +%s); timeout 150 python3 $P/tma_probe.py $D/tma.json > $D/tma.txt 2>&1; echo "tma rc $? $(( $(date +%s) - S )) s"
grep -v Warning $D/tma.txt | tail -100
tar -czf $OUT/c1.tgz -C /tmp c1
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  timeout ${TL:-90} python3 $P/var_plan.py $v $D/probe.json bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"
  grep -E "prompt plan|^ +none|Error|error" $D/$name.txt | cut -c1-200 | head -4
  tar -czf $OUT/c1.tgz -C /tmp c1
}
E="--input-len 1024 --output-len 128 --num-prompts 32"
run e_base1 base $E
run e_best1 best $E
run e_base2 base $E
run e_best2 best $E
echo total $(( $(date +%s) - T0 )) s
