python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x3; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader); echo "$GPU" | tee $D/gpu.txt
run() {  # name, timeout, variant, args...
  local name=$1 t=$2 v=$3; shift 3
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-585} ]; then echo "$name skipped (time)"; return; fi
  S=$(date +%s); timeout $t python3 devrun/s11/var.py "$v" "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/x3.tgz -C /tmp x3
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^ +none|steady|^physical" $D/$name.txt | cut -c1-150
}
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
V24="dplan=32,4,2,1;drows=17,24"
[ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits)" -gt 100000 ] && run m32b 150 base bench kernels --model random:ds-r1-qwen-32b --context 4096 --prefill-len 512 --steps 32 --batch-sizes 1,32
run k_base 70 base bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,24,32
run k24s_base 60 base bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 24
run k24s_var 60 "$V24" bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 24
run k24_var 60 "$V24" bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 24
run k24s_base2 60 base bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 24
run e8k_1 50 base $E
run e32k_1 50 base $E --max-num-batched-tokens 32768
run e8k_2 50 base $E
run e32k_2 50 base $E --max-num-batched-tokens 32768
echo total $(( $(date +%s) - T0 )) s
