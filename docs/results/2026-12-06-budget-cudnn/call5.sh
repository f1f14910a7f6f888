python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x5; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
ls ~/.cache 2>/dev/null; ls ~/.nv 2>/dev/null; env | grep -i cudnn
for i in 1 2; do
  S=$(date +%s); timeout 120 python3 devrun/s11/cudnn_builds.py $D/builds_$i.json > $D/builds_$i.txt 2>&1
  echo "builds $i rc $? $(( $(date +%s) - S )) s"; grep -v Warning $D/builds_$i.txt | cut -c1-150; tar -czf $OUT/x5.tgz -C /tmp x5
done
echo total $(( $(date +%s) - T0 )) s
