python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
B="python3 -m hifc.entrypoints.cli bench kernels --batch-sizes 1,16,24,32 --context 4096 --prefill-len 8192"
echo new; timeout 70 $B --json $OUT/k_new.json > $OUT/k_new.txt 2>&1; grep -E "^ +(1|16|24|32) " $OUT/k_new.txt
cp hifc/layers/triton_attention.py /tmp/new_ta.py; cp devrun/old/triton_attention.py hifc/layers/triton_attention.py
echo old; timeout 70 $B --json $OUT/k_old.json > $OUT/k_old.txt 2>&1; grep -E "^ +(1|16|24|32) " $OUT/k_old.txt
cp /tmp/new_ta.py hifc/layers/triton_attention.py
timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_decode_graphs_triton.py -k "balanced or plan_from" 2>&1 | tee $OUT/tests1.txt | tail -2
timeout 130 python3 devrun/probe/seg.py 2>&1 | tee $OUT/seg.txt | tail -11
