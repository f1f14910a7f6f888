python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p4
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # name, variant, args...
  local name=$1 v=$2; shift 2
  timeout 90 python3 devrun/p/var.py $v bench kernels "$@" --json /tmp/p4/$name.json > /tmp/p4/$name.txt 2>&1
  echo "$name $v rc $?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" /tmp/p4/$name.txt | cut -c1-150
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 1"
run base base $A
run o add_sumsq $A
run o_g add_sumsq+norm_sumsq $A
run base2 base $A
run o2 add_sumsq $A
run o_g2 add_sumsq+norm_sumsq $A
tar -czf $OUT/p4.tgz -C /tmp p4
