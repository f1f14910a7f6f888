# Either card: issue 16's targets at HEAD; the 32B stage first where the card is an H200.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash devrun/call3.sh decode-32b decode-8b e2e govreport
else
  bash devrun/call3.sh decode-8b e2e govreport
fi
