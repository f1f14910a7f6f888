python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/k4b; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2; local S=$(date +%s)
  timeout 60 python3 docs/results/2026-12-06-split-fa/var_release.py "$v" bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/k4b.tgz -C /tmp k4b; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $D/$name.txt | cut -c1-120
}
A="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 1,16,32"
for i in 1 2; do run base$i base $A; run rows$i nrf_rows $A; [ $(( $(date +%s) - T0 )) -gt 150 ] && break; done
echo "total $(( $(date +%s) - T0 )) s"
