python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/p4
nvidia-smi --query-gpu=name --format=csv,noheader
E="bench throughput --model random:ds-r1-llama-8b --compare none --input-len 1024 --output-len 128 --num-prompts 32 --no-progress"
for v in old new; do
  if [ $v = old ]; then (cd devrun/old && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m hifc.entrypoints.cli $E --json /tmp/p4/e_$v.json > /tmp/p4/e_$v.txt 2>&1)
  else timeout 150 python3 -m hifc.entrypoints.cli $E --json /tmp/p4/e_$v.json > /tmp/p4/e_$v.txt 2>&1; fi
  echo "e_$v rc $?"; grep -vE '^INFO|^\[W|Warning' /tmp/p4/e_$v.txt | tail -8 | cut -c1-200
done
B="bench kernels --context 1024 --prefill-len 512 --steps 48 --batch-sizes 32"
(cd devrun/old && PYTHONPATH=/tmp/site:$PWD timeout 90 python3 -m hifc.entrypoints.cli $B > /tmp/p4/b_old.txt 2>&1); echo "b_old rc $?"; grep -E "^ +32 |^model" /tmp/p4/b_old.txt | cut -c1-150
timeout 90 python3 -m hifc.entrypoints.cli $B > /tmp/p4/b_new.txt 2>&1; echo "b_new rc $?"; grep -E "^ +32 |^model" /tmp/p4/b_new.txt | cut -c1-150
tar -czf $OUT/p4.tgz -C /tmp p4
