# Either card. H200: issue 16's targets (8B stages first, then the 32B where it fits, then 32k).
# H100: the 32k prefill, base (2adac09) against new (HEAD), alternating, twice each.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash devrun/call3.sh decode-8b e2e govreport decode-32b prefill-32k
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONUNBUFFERED=1
  D=/tmp/p32k; mkdir -p $D
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
  run() {  # run VARIANT N
    local v=$1 n=$2 p=$PWD; [ "$v" = base ] && p=$PWD/devrun/base
    (cd $p && export PYTHONPATH=/tmp/site:$p && python3 -c "import hifc; print(hifc.__file__)" > $D/$v-$n.where &&
     timeout 200 python3 -m hifc.entrypoints.cli bench kernels --model random:ds-r1-llama-8b \
       --context 512 --steps 4 --batch-sizes 1 --prefill-len 32768 --prefill-repeats 3 \
       --json $D/$v-$n.json > $D/$v-$n.log 2>&1)
    echo "$v-$n rc=$? $(grep -h '^prefill' $D/$v-$n.log)"
    tar -czf $OUT/p32k.tgz -C /tmp p32k
  }
  for i in 1 2; do run base $i; run new $i; done
fi
