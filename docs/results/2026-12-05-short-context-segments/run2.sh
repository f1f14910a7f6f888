python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for v in base seg2x; do
  timeout 75 python3 devrun/short/var.py $v bench kernels --batch-sizes 32 --context 1024 --prefill-len 512 --steps 48 --json $OUT/k_$v.json > $OUT/k_$v.txt 2>&1
  echo "$v rc $?"; grep -E "^ +[0-9]+ +1024 |^model" $OUT/k_$v.txt | cut -c1-150
done
