# Any card: the GPU files whose engines take an explicit KV pool on CUDA (the step check of
# 4f16f20), plus the limits and hf_overrides files.
FILES="tests/engine/test_gpu_engine.py tests/runtime/test_decode_graphs_gpu.py tests/engine/test_async_gpu.py
  tests/engine/test_structured_gpu.py tests/server/test_server_gpu.py tests/tiers/test_tiers_gpu.py
  tests/tiers/test_tiers_fp8.py tests/models/test_dtypes_and_presets.py tests/runtime/test_decode_graphs_triton.py"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c15; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
( timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=8 $FILES > $D/tests-gpu.log 2>&1 )
echo "gpu tests rc=$? $(tail -1 $D/tests-gpu.log)"; tar -czf $OUT/c15.tgz -C /tmp c15
( timeout 100 python3 -m pytest -q -p no:cacheprovider tests/engine/test_limits.py tests/models/test_hf_overrides.py > $D/tests-cpu.log 2>&1 )
echo "limits/overrides rc=$? $(tail -1 $D/tests-cpu.log)"; tar -czf $OUT/c15.tgz -C /tmp c15
grep -E "FAILED|ERROR" $D/*.log | head
