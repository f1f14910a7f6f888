python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x7; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
for i in 1 2; do
  S=$(date +%s); timeout 60 python3 devrun/s11/warm_kinds.py $D/kinds_$i.json > $D/kinds_$i.txt 2>&1
  echo "kinds $i rc $? $(( $(date +%s) - S )) s"; grep -v Warn $D/kinds_$i.txt
done
tar -czf $OUT/x7.tgz -C /tmp x7
echo total $(( $(date +%s) - T0 )) s
