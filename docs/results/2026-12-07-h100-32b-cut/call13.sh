# H100: the 32B preset cut to 40 layers through --hf-overrides (0d33b33), batch 32 at 4,096 keys,
# beside devrun/var_layers.py's 22.03 ms (1.06).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c13; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
timeout 150 python3 -m hifc.entrypoints.cli bench kernels --model random:ds-r1-qwen-32b \
  --hf-overrides '{"num_hidden_layers": 40}' --context 4096 --prefill-len 512 --steps 32 \
  --batch-sizes 32 --kv-cache-gib 22 --max-num-batched-tokens 4608 --json $D/cut40.json > $D/cut40.log 2>&1
echo "rc=$?"; grep -E "^model|^ +[0-9]+ +[0-9]+ |^prefill" $D/cut40.log; tail -2 $D/cut40.log
tar -czf $OUT/c13.tgz -C /tmp c13
