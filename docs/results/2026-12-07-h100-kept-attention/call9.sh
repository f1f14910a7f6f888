# H100 or H200: the last layer attending only the rows that sample. The 32k and 8k prefills,
# base (5c2b406's hifc/ in devrun/base) against new (the working tree), alternating; then the
# GPU files that cover the change.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/c9; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
save() { tar -czf $OUT/c9.tgz -C /tmp c9; }
run() {  # run VARIANT N LEN REPEATS
  local v=$1 n=$2 len=$3 reps=$4 p=$PWD; [ "$v" = base ] && p=$PWD/devrun/base
  (cd $p && export PYTHONPATH=/tmp/site:$p && python3 -c "import hifc; print(hifc.__file__)" > $D/$v-$len-$n.where &&
   timeout 200 python3 -m hifc.entrypoints.cli bench kernels --model random:ds-r1-llama-8b \
     --context 512 --steps 4 --batch-sizes 1 --prefill-len $len --prefill-repeats $reps \
     --json $D/$v-$len-$n.json > $D/$v-$len-$n.log 2>&1)
  echo "$v-$len-$n rc=$? $(grep -h '^prefill' $D/$v-$len-$n.log)"; save
}
P32=${P32:-2} P8=${P8:-3}  # pairs of each
for i in $(seq $P32); do run base $i 32768 3; run new $i 32768 3; done
for i in $(seq $P8); do run base $i 8192 7; run new $i 8192 7; done
FILES=${FILES:-"tests/layers/test_triton_attention.py tests/engine/test_gpu_engine.py
    tests/runtime/test_decode_graphs_gpu.py tests/engine/test_async_gpu.py
    tests/models/test_dtypes_and_presets.py tests/tiers/test_tiers_fp8.py"}
( export PYTHONPATH=/tmp/site:$PWD; timeout ${TESTS_S:-300} python3 -m pytest -q -p no:cacheprovider -m gpu \
    $FILES > $D/tests.log 2>&1 )
echo "tests rc=$? $(tail -1 $D/tests.log)"; save
