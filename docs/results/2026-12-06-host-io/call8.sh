python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
D=/tmp/c8; mkdir -p $D; ROOT=$PWD; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_host_io.py tests/runtime/test_decode_graphs_gpu.py tests/engine/test_async_gpu.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -3 $D/tests.txt; tar -czf $OUT/c8.tgz -C /tmp c8
K="bench kernels --context 4096 --prefill-len 512 --steps 96 --batch-sizes 1,32"
for v in new old; do
  if [ $v = old ]; then cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; fi
  timeout 40 python3 -m hifc.entrypoints.cli $K --json $D/k_$v.json > $D/k_$v.txt 2>&1; echo "$v rc $?"
  grep -E "^ +[0-9]+ +4096 " $D/k_$v.txt; cd $ROOT; tar -czf $OUT/c8.tgz -C /tmp c8
done
