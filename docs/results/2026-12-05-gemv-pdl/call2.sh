python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p2
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_gemv.py -k "rows or wide" > /tmp/p2/tests.txt 2>&1; echo "tests rc $?"; tail -4 /tmp/p2/tests.txt
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  if [ "$v" = old ]; then (cd devrun/old && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m hifc.entrypoints.cli bench kernels "$@" --json /tmp/p2/$name.json > /tmp/p2/$name.txt 2>&1)
  else timeout 100 python3 devrun/p/var.py $v bench kernels "$@" --json /tmp/p2/$name.json > /tmp/p2/$name.txt 2>&1; fi
  echo "$name $v rc $?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" /tmp/p2/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 4,16,32"
B="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
run a_old old $A
run a_new nopf $A
run b_old old $B
run b_new nopf $B
run a2_new nopf $A
run a2_old old $A
run b2_new nopf $B
run b2_old old $B
tar -czf $OUT/p2.tgz -C /tmp p2
