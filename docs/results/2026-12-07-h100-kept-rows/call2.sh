# Any card: the GPU files the last-layer, warm-up and padded-logits changes touch (cold Triton
# caches), then a base/new pair of 32 x 1,024 and GovReport-like (kernel_compiles must be empty).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c2; mkdir -p $D
export SNAP="tar -czf $OUT/c2.tgz -C /tmp c2"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 tests/runtime/test_decode_graphs_gpu.py tests/engine/test_gpu_engine.py tests/engine/test_async_gpu.py > $D/tests.txt 2>&1
echo "tests rc $?"; tail -12 $D/tests.txt; eval "$SNAP"
bash devrun/ab.sh $D/ab1 1 e2e gov
