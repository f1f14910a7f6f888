python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x1; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader); echo "$GPU" | tee $D/gpu.txt
run() {  # name, timeout, variant, args...
  local name=$1 t=$2 v=$3; shift 3
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-580} ]; then echo "$name skipped (time)"; return; fi
  S=$(date +%s); timeout $t python3 devrun/s11/var.py "$v" "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/x1.tgz -C /tmp x1
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^physical|^ +none|ideal|steps" $D/$name.txt | cut -c1-170
}
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
G="bench throughput --model random:ds-r1-llama-8b --compare none --profile govreport --num-prompts 32 --no-progress"
run e8k_1 80 base $E
run e32k_1 80 base $E --max-num-batched-tokens 32768
run e16k_1 80 base $E --max-num-batched-tokens 16384
run e32kd_1 80 dense_max=32 $E --max-num-batched-tokens 32768
run e32k_2 80 base $E --max-num-batched-tokens 32768
run e8k_2 80 base $E
run e32kd_2 80 dense_max=32 $E --max-num-batched-tokens 32768
run g8k 90 base $G
run g32k 90 base $G --max-num-batched-tokens 32768
echo total $(( $(date +%s) - T0 )) s
