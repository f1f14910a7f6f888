# device call 3: end to end at 8,192 tokens per step against the default (16,384 on a GPU of
# 70 GiB or more), alternating, on one machine
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/call3; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, args...
  local name=$1; shift; local S=$(date +%s)
  timeout 90 python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name rc $? $(( $(date +%s) - S )) s"; grep -E "^ +none" $D/$name.txt | cut -c1-80
  tar -czf $OUT/call3.tgz -C /tmp call3
}
E="--input-len 1024 --output-len 128 --num-prompts 32"
for i in 1 2 3; do run e8k$i $E --max-num-batched-tokens 8192; run edef$i $E; done
for i in 1 2; do run gdef$i --profile govreport --num-prompts 32; run g8k$i --profile govreport --num-prompts 32 --max-num-batched-tokens 8192; done
echo total $(( $(date +%s) - T0 )) s
