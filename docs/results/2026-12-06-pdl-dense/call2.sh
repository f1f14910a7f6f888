python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
D=/tmp/b2; rm -rf $D; mkdir -p $D; ROOT=$PWD; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $D/gpu.txt
use() { if [ $1 = base ]; then cd $ROOT; export PYTHONPATH=/tmp/site:$ROOT; else cd $ROOT/devrun/$1; export PYTHONPATH=/tmp/site:$ROOT/devrun/$1; fi; }
cd $ROOT/devrun/pdl; export PYTHONPATH=/tmp/site:$ROOT/devrun/pdl
S=$(date +%s); timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/layers/test_triton_pdl.py tests/layers/test_triton_gemv.py tests/layers/test_linear.py tests/runtime/test_decode_graphs_gpu.py > $D/tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - S )) s"; tail -4 $D/tests.txt; cd $ROOT
tar -czf $OUT/b2.tgz -C /tmp b2
k() {  # name, variant, args
  local name=$1 v=$2; shift 2; local S=$(date +%s); use $v
  timeout 60 python3 -m hifc.entrypoints.cli bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $? $(( $(date +%s) - S )) s"; cd $ROOT; tar -czf $OUT/b2.tgz -C /tmp b2; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $D/$name.txt | cut -c1-120
}
A="--context 1024 --prefill-len 512 --steps 48 --batch-sizes 1,32"
B="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,32"
for i in 1 2; do k kb$i base $A; k kp$i pdl $A; k kb4_$i base $B; k kp4_$i pdl $B; [ $(( $(date +%s) - T0 )) -gt 330 ] && break; done
E="bench throughput --model random:ds-r1-llama-8b --compare none --no-progress --input-len 1024 --output-len 128 --num-prompts 32"
for v in base pdl; do
  [ $(( $(date +%s) - T0 )) -gt 480 ] && break
  use $v; S=$(date +%s); timeout 60 python3 -m hifc.entrypoints.cli $E --json $D/e_$v.json > $D/e_$v.txt 2>&1
  echo "e $v rc $? $(( $(date +%s) - S )) s"; grep -E "^ +none" $D/e_$v.txt | cut -c1-200; cd $ROOT; tar -czf $OUT/b2.tgz -C /tmp b2
done
echo total $(( $(date +%s) - T0 )) s
