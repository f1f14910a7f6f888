# A/B of end-to-end runs: base (devrun/base/hifc, 2adac09) against new (the working tree), alternating.
# Usage: bash devrun/ab.sh OUTDIR PAIRS WORKLOAD...   (WORKLOAD: e2e | gov)
set -uo pipefail
out=$1; pairs=$2; shift 2
mkdir -p $out
for w in "$@"; do
  case $w in
    e2e) args="--input-len 1024 --output-len 128 --num-prompts 32";;
    gov) args="--profile govreport --num-prompts 32";;
  esac
  for i in $(seq $pairs); do
    for v in base new; do
      dir=$PWD; [ $v = base ] && dir=$PWD/devrun/base
      PYTHONPATH=$dir:/tmp/site STEPS_OUT=$out/$w-$i-$v.steps timeout 200 python3 devrun/var_steps.py bench throughput --model random:ds-r1-llama-8b --compare none --no-progress $args --json $out/$w-$i-$v.json > $out/$w-$i-$v.log 2>&1 || echo "$w-$i-$v FAILED"
      python3 -c "
import json,sys; d=json.load(open('$out/$w-$i-$v.json')); v=d['variants'][0]; i=d['workload']['ideal']
print('$w $i $v', 'elapsed %.3f s' % v['elapsed_s'], 'out tok/s %.1f' % v['output_tokens_per_s'], 'of ideal %.3f' % v['fraction_of_ideal'], 'sust %.3f' % v['fraction_of_sustained_ideal'], 'ideal_prefill %.4f' % i['ideal_prefill_s'], 'compiles', len(v['kernel_compiles']), 'steps', v['steps'])" 2>&1 | tail -1
      [ -n "${SNAP:-}" ] && eval "$SNAP"
    done
  done
done
