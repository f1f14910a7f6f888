python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/k2; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 150 python3 docs/results/2026-12-06-split-fa/fa_probe.py $D/fa.json > $D/fa.txt 2>&1
echo "probe rc $? $(( $(date +%s) - S )) s"; grep -v Warning $D/fa.txt | cut -c1-700
tar -czf $OUT/k2.tgz -C /tmp k2
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  timeout 100 python3 docs/results/2026-12-06-split-fa/var_fa.py "$v" bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/k2.tgz -C /tmp k2; grep -E "tok/s|ideal|Error|error" $D/$name.txt | cut -c1-250 | head -8
}
E="--input-len 1024 --output-len 128 --num-prompts 32"
run e_base1 base $E
run e_fa1 fa $E
run e_base2 base $E
run e_fa2 fa $E
if [ $(( $(date +%s) - T0 )) -lt 420 ]; then run g_base base --profile govreport --num-prompts 32; run g_fa fa --profile govreport --num-prompts 32; fi
echo "total $(( $(date +%s) - T0 )) s"
