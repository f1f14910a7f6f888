python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/x2; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader); echo "$GPU" | tee $D/gpu.txt
run() {  # name, timeout, variant, args...
  local name=$1 t=$2 v=$3; shift 3
  if [ $(( $(date +%s) - T0 + t )) -gt ${LIMIT:-585} ]; then echo "$name skipped (time)"; return; fi
  S=$(date +%s); timeout $t python3 devrun/s11/var.py "$v" "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; tar -czf $OUT/x2.tgz -C /tmp x2
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^ +none" $D/$name.txt | cut -c1-120
}
S=$(date +%s); timeout 200 python3 devrun/s11/attn_plans.py $D/plans.json > $D/plans.txt 2>&1
echo "plans rc $? $(( $(date +%s) - S )) s"; cat $D/plans.txt | cut -c1-200; tar -czf $OUT/x2.tgz -C /tmp x2
BEST=$(python3 -c "
import json; r=[x for x in json.load(open('$D/plans.json'))['rows'] if x.get('batch')==32 and x.get('context')==1100 and 'us' in x]
cur=[x for x in r if x['plan']=='current'][0]['us']; r=[x for x in r if x['plan']!='current' and x['us']<0.97*cur]
print(' '.join(x['plan'].replace('/',',').replace('w','').replace('s','') for x in r[:2]))")
echo "best: $BEST"
K="bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
run k_base 70 base $K
for b in $BEST; do run k_$b 70 "dplan=$b" $K; done
run k_base2 70 base $K
B1=$(echo $BEST | cut -d' ' -f1)
if [ -n "$B1" ]; then
  run e_base 60 base $E; run e_best 60 "dplan=$B1" $E; run e_best2 60 "dplan=$B1" $E; run e_base2 60 base $E
  run k4_base 70 base bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 16,32
  run k4_best 70 "dplan=$B1" bench kernels --context 4096 --prefill-len 512 --steps 48 --batch-sizes 16,32
fi
echo total $(( $(date +%s) - T0 )) s
