# H200: call1's new-against-old runs, tests, 32B and end to end; H100: the 8k prefill's kernels under load
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$GPU" in
*H200*) LIMIT=${LIMIT:-560} bash docs/results/2026-12-06-head-h100/call1.sh;;
*) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; D=/tmp/s9; mkdir -p $D; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $D/gpu.txt
   timeout 200 python3 -m hifc.entrypoints.cli bench kernels --context 1024 --prefill-len 8192 --steps 16 --batch-sizes 32 --profile --json $D/prof_p8k.json > $D/prof_p8k.txt 2>&1
   echo rc $?; tar -czf $OUT/s9.tgz -C /tmp s9; grep -v Warn $D/prof_p8k.txt | sed -n '/^prefill/,$p' | head -40;;
esac
