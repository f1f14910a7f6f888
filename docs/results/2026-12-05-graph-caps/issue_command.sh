python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
ROOT=$PWD
K="python3 -m hifc.entrypoints.cli bench kernels --context 4096 --batch-sizes 1,32,128 --prefill-len 8192"
for v in new old; do d=$ROOT; [ $v = old ] && d=$ROOT/devrun/old
  (cd $d && timeout 140 $K --json $OUT/h_$v.json > $OUT/h_$v.txt 2>&1; echo "$v rc $?")
  grep -E "^ +[0-9]+ +4096 |captured|^prefill|^model" $OUT/h_$v.txt | cut -c1-160
done
