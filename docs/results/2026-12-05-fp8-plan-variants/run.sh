python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for v in $VARIANTS; do
  timeout ${T:-80} python3 devrun/var/fp8var.py $v --batch-sizes 32,128 --context 4096 --prefill-len 512 --kv-cache-dtype fp8 $EXTRA --json $OUT/v_$v.json > $OUT/v_$v.txt 2>&1
  echo "$v rc $?"; grep -E "^ +[0-9]+ +4096 " $OUT/v_$v.txt
done
