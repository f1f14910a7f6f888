# The 8k prefill, base (2adac09: the last layer on every row) against new (HEAD), same machine,
# alternating, then one profiled prefill of each.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=$OUT/p8k; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
git log --oneline -1 2>/dev/null | tee -a $D/gpu.txt
run() {  # run VARIANT N [extra args]
  local v=$1 n=$2; shift 2
  local p=$PWD; [ "$v" = base ] && p=$PWD/devrun/base
  (cd $p && export PYTHONPATH=/tmp/site:$p && python3 -c "import hifc; print(hifc.__file__)" > $D/$v-$n.where && timeout 150 python3 -m hifc.entrypoints.cli bench kernels \
    --model random:ds-r1-llama-8b --context 512 --steps 4 --batch-sizes 1 --prefill-len 8192 \
    --prefill-repeats 7 --json $D/$v-$n.json "$@" > $D/$v-$n.log 2>&1)
  echo "$v-$n rc=$? $(grep -h '^prefill' $D/$v-$n.log)"
}
for i in 1 2 3; do run base $i; run new $i; done
run base prof --profile; run new prof --profile
