export PYTHONUNBUFFERED=1; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD; D=/tmp/c7; mkdir -p $D
for bs in 64 128 32 256; do timeout 60 python3 -m hifc.entrypoints.cli bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32 --block-size $bs --json $D/k_bs$bs.json > $D/k_bs$bs.txt 2>&1; echo "bs $bs rc $?"; grep -E "^ +32 " $D/k_bs$bs.txt; done
for bs in 128 64; do timeout 50 python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress --block-size $bs --json $D/e_bs$bs.json > $D/e_bs$bs.txt 2>&1; echo "e2e bs $bs rc $?"; grep -E "^ +none" $D/e_bs$bs.txt; done
tar -czf $OUT/c7.tgz -C /tmp c7
