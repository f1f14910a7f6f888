python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/k4; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, script, variant, args...
  local name=$1 s=$2 v=$3; shift 3; local S=$(date +%s)
  timeout 100 python3 docs/results/2026-12-06-split-fa/$s "$v" bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/k4.tgz -C /tmp k4; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |Error" $D/$name.txt | cut -c1-200 | head -6
}
A="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 1,32"
run base1 var_release.py base $A
run nrf1 var_release.py nrf $A
run nrfrows1 var_release.py nrf_rows $A
run w4 var_release.py w4 $A
run w8 var_release.py w8 $A
run neither var_ablate.py neither $A
run base2 var_release.py base $A
run nrf2 var_release.py nrf $A
run nrfw4 var_release.py nrf_w4 $A
echo "total $(( $(date +%s) - T0 )) s"
