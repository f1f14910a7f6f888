export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
D=/tmp/c4; mkdir -p $D; nvidia-smi --query-gpu=name --format=csv,noheader | tee $D/gpu.txt
S=$(date +%s); timeout 400 python3 -m pytest -v -m gpu -p no:cacheprovider $(cat devrun/s10/part2_ids.txt) > $D/suite2.txt 2>&1
echo "part2 rc $? $(( $(date +%s) - S )) s"; tail -3 $D/suite2.txt; grep -E " FAILED| ERROR" $D/suite2.txt | head
tar -czf $OUT/c4.tgz -C /tmp c4
