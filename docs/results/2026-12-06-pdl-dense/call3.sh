python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/b3; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
cd $ROOT/devrun/dense; export PYTHONPATH=/tmp/site:$ROOT/devrun/dense
S=$(date +%s); timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_attention.py tests/runtime/test_warm_up.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt; cd $ROOT
tar -czf $OUT/b3.tgz -C /tmp b3
E="bench throughput --model random:ds-r1-llama-8b --compare none --no-progress --input-len 1024 --output-len 128 --num-prompts 32"
for v in pdl base; do
  [ $(( $(date +%s) - T0 )) -gt 420 ] && break
  cd $ROOT/devrun/$v 2>/dev/null || cd $ROOT; export PYTHONPATH=/tmp/site:$PWD
  S=$(date +%s); timeout 60 python3 -m hifc.entrypoints.cli $E --json $D/e_$v.json > $D/e_$v.txt 2>&1
  echo "e $v rc $? $(( $(date +%s) - S )) s"; grep -E "^ +none" $D/e_$v.txt | cut -c1-200; cd $ROOT; tar -czf $OUT/b3.tgz -C /tmp b3
done
echo total $(( $(date +%s) - T0 )) s
