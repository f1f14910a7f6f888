python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/q2; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  timeout 90 python3 devrun/q/var.py "$v" bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $?"; tar -czf $OUT/q2.tgz -C /tmp q2; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" $D/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 32"
B="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
run b32 base $A
run b32_n32k256s3 "rows32=32,256,3" $A
run b32_n32k128s4 "rows32=32,128,4" $A
run b32_n64k128s4 "rows32=64,128,4" $A
run b32_1k base $B
run b32_1k_n32k256s3 "rows32=32,256,3" $B
run b32_b base $A
