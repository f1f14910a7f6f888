python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
V=${V:-dram,flash,recompute,auto}; TAG=${TAG:-a}
for m in ds-r1-llama-8b ds-r1-qwen-14b mistral-7b; do
  S=$(date +%s)
  python3 scripts/gpu_swap_stall.py --model random:$m --cells qasper,govreport --variants $V --out $OUT/$TAG > $OUT/$TAG-$m.txt 2>&1
  echo "$m rc $? $(( $(date +%s) - S )) s"; sed -n '/^flash vs DRAM/,$p' $OUT/$TAG-$m.txt
done
if [ -n "$HEAVY" ]; then
  S=$(date +%s)
  python3 scripts/gpu_swap_stall.py --cells swap-heavy --variants dram,flash --out $OUT/$TAG > $OUT/$TAG-heavy.txt 2>&1
  echo "heavy rc $? $(( $(date +%s) - S )) s"; sed -n '/^flash vs DRAM/,$p' $OUT/$TAG-heavy.txt
fi
