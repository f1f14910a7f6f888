# calls 5 and 6 (call 5 looped over "8k 0" "8k_prewarm 0 PREWARM" "16k 16384"; call 6 over "8kb 0")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/s8e; mkdir -p $D; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
for v in "8kb 0"; do set -- $v; S=$(date +%s)
  env ${3:+$3=1} timeout 100 python3 devrun/s8/steps.py $2 $D/$1.json > $D/$1.txt 2>&1; echo "$1 rc $? $(( $(date +%s) - S )) s"; grep "^run" $D/$1.txt | cut -c1-700
  tar -czf $OUT/s8e.tgz -C /tmp s8e; done
