python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/k3; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  timeout 100 python3 docs/results/2026-12-06-split-fa/var_ablate.py "$v" bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/k3.tgz -C /tmp k3; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |Error" $D/$name.txt | cut -c1-200 | head -6
}
A="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 1,32"
for v in base nonorm nosilu neither base neither; do run a_$v$(( $(date +%s) % 1000 )) $v $A; done
echo "total $(( $(date +%s) - T0 )) s"
