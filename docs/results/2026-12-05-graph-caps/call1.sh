python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
ROOT=$PWD
K="python3 -m hifc.entrypoints.cli bench kernels --context 4096"
run() {  # name dir args...
  local name=$1 dir=$2; shift 2
  (cd $dir && timeout 90 $K "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1; echo "$name rc $?")
  grep -E "^ +[0-9]+ +4096 |captured" $OUT/$name.txt
}
run k_new $ROOT --batch-sizes 1,16,24,32 --prefill-len 8192
run k_old $ROOT/devrun/old --batch-sizes 1,16,24,32 --prefill-len 8192
run l_new $ROOT --batch-sizes 16,32 --prefill-len 512 --max-model-len 131072
run l_old $ROOT/devrun/old --batch-sizes 16,32 --prefill-len 512 --max-model-len 131072
export PYTHONPATH=/tmp/site:$ROOT
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_decode_graphs_gpu.py tests/runtime/test_decode_graphs_triton.py "tests/layers/test_triton_attention.py::test_leading_decodes_rotate_in_their_launch_as_the_decode_graphs" 2>&1 | tee $OUT/tests1.txt | tail -4
