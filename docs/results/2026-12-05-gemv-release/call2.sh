python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p2
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_gemv.py 2>&1 | tail -4
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  if [ "$v" = old ]; then (cd devrun/old && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 var.py old bench kernels "$@" --json /tmp/p2/$name.json > /tmp/p2/$name.txt 2>&1)
  else timeout 110 python3 devrun/p1/var.py $v bench kernels "$@" --json /tmp/p2/$name.json > /tmp/p2/$name.txt 2>&1; fi
  echo "$name $v rc $?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" /tmp/p2/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48"
run a_old old --batch-sizes 1,4,16,24,32 $A
run a_new new+r32+rel --batch-sizes 1,4,16,24,32 $A
run a_nosilu new+r32+nosilu --batch-sizes 16,24,32 $A
B="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
run b_old old $B
run b_new new+r32 $B
run b_nosilu new+r32+nosilu $B
run a2_old old --batch-sizes 1,4,16,24,32 $A
run a2_new new+r32+rel --batch-sizes 1,4,16,24,32 $A
tar -czf $OUT/p2.tgz -C /tmp p2
