# device call 4 (an H200 only): the 32B preset's decode steps at batch 32 and 1 at 4,096 keys,
# the 8B's at batch 1, 32 and 128, and the end-to-end run at the default budget
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/call4; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
C="python3 -m hifc.entrypoints.cli"
run() { local name=$1 lim=$2; shift 2; local S=$(date +%s); timeout $lim "$@" > $D/$name.txt 2>&1; echo "$name rc $? $(( $(date +%s) - S )) s"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |steady|floor|^ +none|started up" $D/$name.txt | cut -c1-200 | head -12; tar -czf $OUT/call4.tgz -C /tmp call4; }
if grep -q H200 $D/gpu.txt; then
run m32b 240 $C bench kernels --model random:ds-r1-qwen-32b --context 4096 --prefill-len 512 --steps 32 --batch-sizes 32,1 --json $D/m32b.json
run k8 130 $C bench kernels --context 4096 --prefill-len 8192 --steps 48 --batch-sizes 1,32,128 --json $D/k8.json
run e2e 90 $C bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress --json $D/e2e.json
else echo "not an H200"; fi
echo total $(( $(date +%s) - T0 )) s
