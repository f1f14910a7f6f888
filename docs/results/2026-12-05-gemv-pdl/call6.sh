python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p6
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # name, old|new, args...
  local name=$1 v=$2; shift 2
  if [ "$v" = old ]; then (cd devrun/old && PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -m hifc.entrypoints.cli bench kernels "$@" --json /tmp/p6/$name.json > /tmp/p6/$name.txt 2>&1)
  else timeout 60 python3 -m hifc.entrypoints.cli bench kernels "$@" --json /tmp/p6/$name.json > /tmp/p6/$name.txt 2>&1; fi
  echo "$name rc $?"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |^model" /tmp/p6/$name.txt | cut -c1-150
  tar -czf $OUT/p6.tgz -C /tmp p6
}
A="--context 4096 --prefill-len 512 --steps 48 --batch-sizes 1"
run k_new new $A
run k_old old $A
run k2_new new $A
run k2_old old $A
