# device call 2: the merged-segments plan (the working tree) against main (devrun/base, a
# `git archive` of 93a06d7's hifc/) at batch 1, 2 and 4, alternating; then the paged-attention,
# decode-graph and PDL GPU tests on the new plan
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
ROOT=$PWD; D=/tmp/call2; rm -rf $D; mkdir -p $D; T0=$(date +%s); export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
run() {  # name, variant (base | new)
  local S=$(date +%s)
  if [ $2 = new ]; then cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; else cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; fi
  timeout 80 python3 -m hifc.entrypoints.cli bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,2,4 --json $D/$1.json > $D/$1.txt 2>&1
  echo "$1 rc $? $(( $(date +%s) - S )) s"; grep -E '^ +[124] +4096' $D/$1.txt | cut -c1-100; cd $ROOT
  tar -czf $OUT/call2.tgz -C /tmp call2
}
run new1 new; run base1 base; run new2 new; run base2 base
export PYTHONPATH=/tmp/site:$ROOT
S=$(date +%s); timeout $(( 590 - $(date +%s) + T0 )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_attention.py tests/runtime/test_decode_graphs_gpu.py tests/layers/test_triton_pdl.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt; tar -czf $OUT/call2.tgz -C /tmp call2
echo total $(( $(date +%s) - T0 )) s
