# H100: the 32B preset's decode shapes at the batch sizes that do not fit this card whole, through
# the preset cut to its first N layers (devrun/var_layers.py); the whole 32B at batch 1 and 8
# beside the 40-layer cut, to show how the cut's step / floor follows the whole model's.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c11; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
save() { tar -czf $OUT/c11.tgz -C /tmp c11; }
k() {  # k NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2; local s=$(date +%s)
  timeout $t "$@" --json $D/$name.json > $D/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - s )) s"; grep -E "^ +[0-9]+ +[0-9]+ " $D/$name.log; save
}
[ -n "$SKIP40" ] || k cut40 200 python3 devrun/var_layers.py 40 bench kernels --model random:ds-r1-qwen-32b-40l \
  --context 4096 --prefill-len 512 --steps 32 --batch-sizes 1,8,32 --kv-cache-gib 22 --max-num-batched-tokens 4608
k whole 200 python3 -m hifc.entrypoints.cli bench kernels --model random:ds-r1-qwen-32b \
  --context 4096 --prefill-len 512 --steps 32 --batch-sizes 1,8 --kv-cache-gib 8.8 --max-num-batched-tokens 4608
[ -n "$SKIP128" ] || k cut32-128 170 python3 devrun/var_layers.py 32 bench kernels --model random:ds-r1-qwen-32b-32l \
  --context 1536 --prefill-len 512 --steps 32 --batch-sizes 128
