# Either card: on an H200 issue 16's targets (32B first); on an H100 the 8k prefill pair.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash devrun/call3.sh decode-32b decode-8b e2e govreport
else
  bash devrun/call5.sh
fi
