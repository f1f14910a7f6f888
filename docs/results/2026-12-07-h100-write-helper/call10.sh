# Any card: the GPU files covering cc4a08f's shared rotate-and-write path.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c10; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
git rev-parse HEAD 2>/dev/null > $D/head.txt
FILES=${FILES:-"tests/layers/test_triton_attention.py tests/engine/test_gpu_engine.py
    tests/runtime/test_decode_graphs_gpu.py tests/engine/test_async_gpu.py
    tests/models/test_dtypes_and_presets.py tests/tiers/test_tiers_fp8.py"}
( timeout ${TESTS_S:-480} python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 $FILES > $D/tests.log 2>&1 )
echo "tests rc=$? $(tail -1 $D/tests.log)"; tar -czf $OUT/c10.tgz -C /tmp c10
grep -E "passed|failed|error" $D/tests.log | tail -5
