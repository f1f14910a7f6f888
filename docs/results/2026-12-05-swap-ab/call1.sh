python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/s1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
S=$(date +%s)
timeout 260 python3 devrun/swap/probe.py --json $D/probe.json --best $D/best.json > $D/probe.txt 2>&1
echo "probe rc $? $(( $(date +%s) - S )) s"; grep -E '^copy|^  floor' $D/probe.txt; grep -c errors $D/probe.txt; tar -czf $OUT/s1.tgz -C /tmp s1
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  timeout 90 python3 devrun/swap/var.py "$v" $D/best.json bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $?"; tar -czf $OUT/s1.tgz -C /tmp s1; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" $D/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,4,16,32"
B="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
run base base $A
run swap swap $A
run base1k base $B
run swap1k swap $B
run base_b base $A
run swap_b swap $A
grep -h '^swap' $D/swap.txt | head -12
