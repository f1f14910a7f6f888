python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/k5; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
timeout 60 python3 docs/results/2026-12-06-split-fa/check.py > $D/check.txt 2>&1; echo "check rc $?"; cat $D/check.txt | grep -v Warn | tail -8
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  timeout 100 python3 docs/results/2026-12-06-split-fa/var_fuse.py "$v" bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/k5.tgz -C /tmp k5; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |Error|^fused" $D/$name.txt | cut -c1-200 | head -8
}
A="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 4,16,32"
B="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 32"
run a_base1 base $A
run a_fuse1 fuse $A
run a_base2 base $A
run a_fuse2 fuse $A
run b_base base $B
run b_fuse fuse $B
if [ $(( $(date +%s) - T0 )) -lt 230 ]; then
for v in base fuse; do S=$(date +%s); timeout 60 python3 docs/results/2026-12-06-split-fa/var_fuse.py $v bench throughput --model random:ds-r1-llama-8b --compare none --no-progress --input-len 1024 --output-len 128 --num-prompts 32 --json $D/e_$v.json > $D/e_$v.txt 2>&1; echo "e_$v rc $? $(( $(date +%s) - S )) s"; grep -A1 "variant  out" $D/e_$v.txt | tail -1 | cut -c1-80; done
fi
tar -czf $OUT/k5.tgz -C /tmp k5
echo "total $(( $(date +%s) - T0 )) s"
