python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x8; rm -rf $D; mkdir -p $D; T0=$(date +%s)
S=$(date +%s); timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_decode_graphs_gpu.py tests/engine/test_async_gpu.py tests/runtime/test_warm_up.py tests/layers/test_triton_attention.py -k "warm or densely or fused or chunk or graph or async" > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt
tar -czf $OUT/x8.tgz -C /tmp x8
echo total $(( $(date +%s) - T0 )) s
