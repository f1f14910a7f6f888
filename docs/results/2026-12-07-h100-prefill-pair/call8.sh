# Either card. H200: issue 16's 8B targets, then the 32B where it fits. H100: the GPU server
# tests (the engine in a process of its own on CUDA) at HEAD.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 520 bash devrun/call3.sh decode-8b e2e govreport decode-32b
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $OUT/gpu.txt
  git log --oneline -1 2>/dev/null | tee -a $OUT/gpu.txt
  set -o pipefail
  timeout 400 python3 -m pytest -v -p no:cacheprovider -m gpu tests/server/test_server_gpu.py 2>&1 | tee $OUT/server-gpu.log | tail -25
fi
