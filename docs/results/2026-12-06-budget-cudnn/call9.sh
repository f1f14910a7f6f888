python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x9; rm -rf $D; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 230 python3 -m hifc.entrypoints.cli bench kernels --model random:ds-r1-qwen-32b --context 4096 --prefill-len 512 --steps 32 --batch-sizes 32,1 --json $D/m32b.json > $D/m32b.txt 2>&1
echo "m32b rc $? $(( $(date +%s) - S )) s"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |steady|^model|started up|fused" $D/m32b.txt | cut -c1-200
tar -czf $OUT/x9.tgz -C /tmp x9
