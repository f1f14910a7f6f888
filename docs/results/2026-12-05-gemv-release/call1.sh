python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p1
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1 2; do for v in base rel+rows32; do
  timeout 120 python3 devrun/p1/var.py $v bench kernels --batch-sizes 1,24,32 --context 4096 --prefill-len 512 --steps 48 --json /tmp/p1/k4_${v}_$i.json > /tmp/p1/k4_${v}_$i.txt 2>&1
  echo "$v $i rc $?"; grep -E "^ +[0-9]+ +4096 |^model" /tmp/p1/k4_${v}_$i.txt | cut -c1-150
done; done
for i in 1 2; do for v in base rows32; do
  timeout 90 python3 devrun/p1/var.py $v bench kernels --batch-sizes 32 --context 1024 --prefill-len 512 --steps 48 --json /tmp/p1/k1_${v}_$i.json > /tmp/p1/k1_${v}_$i.txt 2>&1
  echo "$v $i rc $?"; grep -E "^ +[0-9]+ +1024 |^model" /tmp/p1/k1_${v}_$i.txt | cut -c1-150
done; done
tar -czf $OUT/p1.tgz -C /tmp p1
