python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/h1; rm -rf $D; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
if ! grep -q H200 $D/gpu.txt; then echo "not an H200"; fi
C="python3 -m hifc.entrypoints.cli"
run() { local name=$1 lim=$2; shift 2; local S=$(date +%s); timeout $lim "$@" > $D/$name.txt 2>&1; echo "$name rc $? $(( $(date +%s) - S )) s"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |steady|prefill|out tok/s|ideal|started up" $D/$name.txt | cut -c1-220 | head -20; }
if grep -q H200 $D/gpu.txt; then
run m32b 220 $C bench kernels --model random:ds-r1-qwen-32b --context 4096 --prefill-len 512 --steps 32 --batch-sizes 32,1 --json $D/m32b.json
fi
run k8 120 $C bench kernels --context 4096 --prefill-len 8192 --steps 48 --batch-sizes 1,32,128 --json $D/k8.json
run k8s 90 $C bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32 --profile --json $D/k8s.json
for i in 1 2; do run e2e$i 90 $C bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress --json $D/e2e$i.json; done
tar -czf $OUT/h1.tgz -C /tmp h1
