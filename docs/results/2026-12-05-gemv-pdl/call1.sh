python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_gemv.py tests/layers/test_linear.py > /tmp/p1/tests.txt 2>&1; echo "tests rc $?"; tail -4 /tmp/p1/tests.txt
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  if [ "$v" = old ]; then (cd devrun/old && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m hifc.entrypoints.cli bench kernels "$@" --json /tmp/p1/$name.json > /tmp/p1/$name.txt 2>&1)
  else timeout 110 python3 devrun/p/var.py $v bench kernels "$@" --json /tmp/p1/$name.json > /tmp/p1/$name.txt 2>&1; fi
  echo "$name $v rc $?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" /tmp/p1/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,4,32"
run a_old old $A
run a_new new $A
run a_nopf nopf $A
run a_nogate nogate $A
run a2_old old $A
run a2_new new $A
tar -czf $OUT/p1.tgz -C /tmp p1
