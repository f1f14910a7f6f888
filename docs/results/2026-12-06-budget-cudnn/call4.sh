python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x4; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
for b in 8192 32768; do
  S=$(date +%s); timeout 150 python3 devrun/s11/prefill_prof.py $b $D/prof_$b.json > $D/prof_$b.txt 2>&1
  echo "prof $b rc $? $(( $(date +%s) - S )) s"; grep -v "^INFO\|Warning\|warn" $D/prof_$b.txt | head -75; tar -czf $OUT/x4.tgz -C /tmp x4
done
echo total $(( $(date +%s) - T0 )) s
