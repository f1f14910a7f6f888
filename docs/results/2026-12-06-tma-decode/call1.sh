# device call 1: the TMA decode probe; end to end at 8,192 tokens per step and at the default
# (16,384 on a GPU of 70 GiB or more); the attention GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=$OUT/call1; mkdir -p $D; T0=$(date +%s); R=docs/results/2026-12-06-tma-decode
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 200 python3 $R/decode_probe.py $D/probe.json > $D/probe.txt 2>&1
echo "probe rc $? $(( $(date +%s) - S )) s"; cat $D/probe.txt | cut -c1-150
run() {  # name, args...
  local name=$1; shift; local S=$(date +%s)
  timeout 90 python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b --compare none --no-progress "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name rc $? $(( $(date +%s) - S )) s"; grep -E "^ +none|ideal|Error|error" $D/$name.txt | cut -c1-220 | head -4
}
E="--input-len 1024 --output-len 128 --num-prompts 32"
run e8k $E --max-num-batched-tokens 8192
run edef $E
run g8k --profile govreport --num-prompts 32 --max-num-batched-tokens 8192
run gdef --profile govreport --num-prompts 32
S=$(date +%s); timeout $(( 585 - $(date +%s) + T0 )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_prompt_attention.py tests/layers/test_triton_attention.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt
echo total $(( $(date +%s) - T0 )) s
