# H200 only: issue 16's targets (decode 8B and 32B, end to end, GovReport-like) on this card.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/c3; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
( while sleep 20; do tar -czf $OUT/c3.tgz -C /tmp c3; done ) &
bash scripts/gpu_speed_targets.sh $D/t "$@" 2>&1 | tail -30
tar -czf $OUT/c3.tgz -C /tmp c3
