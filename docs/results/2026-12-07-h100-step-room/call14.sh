# Either card: on an H200 issue 16's H200 rows (devrun/call3.sh); on an H100 the explicit-pool
# step check: real peaks against its estimate (devrun/step_room.py), and bench kernels on the
# whole 32B with a given pool and no --max-num-batched-tokens (the one-prompt admission).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash devrun/call3.sh decode-32b decode-8b e2e govreport; exit
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c14; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
save() { tar -czf $OUT/c14.tgz -C /tmp c14; }
s=$(date +%s); timeout 200 python3 devrun/step_room.py > $D/step_room.log 2>&1; echo "step_room rc=$? $(( $(date +%s) - s )) s"
grep -v "^INFO\|^WARNING" $D/step_room.log | tail -8; save
s=$(date +%s); timeout 240 python3 -m hifc.entrypoints.cli bench kernels --model random:ds-r1-qwen-32b \
  --context 4096 --prefill-len 512 --steps 16 --batch-sizes 1,8 --kv-cache-gib 8.8 \
  --json $D/whole.json > $D/whole.log 2>&1
echo "whole rc=$? $(( $(date +%s) - s )) s"; grep -E "admitting|^ +[0-9]+ +[0-9]+ |Error|error" $D/whole.log | tail -8; save
