python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=/tmp/q1; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  timeout 90 python3 devrun/q/var.py "$v" bench kernels "$@" --json $D/$name.json > $D/$name.txt 2>&1
  echo "$name [$v] rc $?"; tar -czf $OUT/q1.tgz -C /tmp q1; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" $D/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 1"
run base base --context 4096 --prefill-len 512 --steps 48 --batch-sizes 1,32
run qkv "pdl=o,gateup,qkv" $A
run down6 "pdl=o,gateup,down;stages_down=6" $A
run down3 "pdl=o,gateup,down" $A
run s6 "stages_down=6" $A
run all6 "pdl=o,gateup,qkv,down;stages_down=6" $A
run reg128 "maxnreg=128" $A
run attn96 "attn_maxnreg=96" $A
run ppsm1 "attn_ppsm=1" $A
run ppsm2 "attn_ppsm=2" $A
run base2 base $A
tar -czf $OUT/q1.tgz -C /tmp q1
