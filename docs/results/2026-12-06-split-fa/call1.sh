python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/k1; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 230 python3 docs/results/2026-12-06-split-fa/probe32.py --json $D/probe.json --best $D/best.json > $D/probe.txt 2>&1
echo "probe rc $? $(( $(date +%s) - S )) s"; grep -E '^copy|^  ' $D/probe.txt | cut -c1-400; grep -E '^read' $D/probe.txt | cut -c1-160
tar -czf $OUT/k1.tgz -C /tmp k1
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  timeout 100 python3 docs/results/2026-12-06-split-fa/var_rows.py "$v" $D/best.json bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/k1.tgz -C /tmp k1; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^best|Error|error" $D/$name.txt | cut -c1-220 | head -12
}
Q="--model random:ds-r1-qwen-32b --context 1024 --prefill-len 512 --steps 32 --batch-sizes 32 --kv-cache-gib 9.8"
run q32_base base $Q
run q32_best best $Q
run q16_base base ${Q/batch-sizes 32/batch-sizes 16}
run q16_best best ${Q/batch-sizes 32/batch-sizes 16}
if [ $(( $(date +%s) - T0 )) -lt 380 ]; then run q32_base2 base $Q; run q32_best2 best $Q; fi
echo "total $(( $(date +%s) - T0 )) s"
