python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x6; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
ls -la ~/.nv 2>&1 | head -3
S=$(date +%s); timeout 150 python3 devrun/s11/prefill_prof.py 8192 $D/prof_new.json > $D/prof_new.txt 2>&1
echo "prof new rc $? $(( $(date +%s) - S )) s"; grep -E "started up|fused prompt|step_wall|span_ms|busy_ms|idle_ms" -A0 $D/prof_new.txt | cut -c1-220; python3 -c "
import json; d=json.load(open('$D/prof_new.json')); print('walls', d['step_wall_ms']); print('gaps', d['largest_gaps'][:4])"
tar -czf $OUT/x6.tgz -C /tmp x6
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
for v in old new old new; do
  if [ $v = old ]; then cd $ROOT/devrun/base; export PYTHONPATH=/tmp/site:$ROOT/devrun/base; else cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; fi
  S=$(date +%s); timeout 80 python3 -m hifc.entrypoints.cli $E --json $D/e_$v.json > $D/e_$v.txt 2>&1
  echo "e $v rc $? $(( $(date +%s) - S )) s"; grep -E "started up|fused prompt|^ +none" $D/e_$v.txt | cut -c1-200; cd $ROOT
done
export PYTHONPATH=/tmp/site:$ROOT
tar -czf $OUT/x6.tgz -C /tmp x6
S=$(date +%s); timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_attention.py -k "warm or densely or fused" tests/runtime/test_warm_up.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt
tar -czf $OUT/x6.tgz -C /tmp x6
echo total $(( $(date +%s) - T0 )) s
