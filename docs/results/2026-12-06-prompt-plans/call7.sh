python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $OUT/gpu.txt
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_prompt_attention.py tests/layers/test_triton_attention.py -k "not head_shapes" 2>&1 | tee $OUT/tests.txt | tail -4
