# H200: call1's new-against-old runs (tests left out); H100: the GovReport-like workload at both token budgets
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$GPU" in
*H200*) sed -e 's/^if \[ \$(( \$(date +%s) - T0 + 170 ))/if false \&\& [ $(( $(date +%s) - T0 + 170 ))/' devrun/s7/call1.sh > /tmp/c1.sh; LIMIT=${LIMIT:-500} bash /tmp/c1.sh;;
*) sed -e 's#^run e8k_1.*#G="bench throughput --model random:ds-r1-llama-8b --compare none --profile govreport --num-prompts 32 --no-progress"\nrun g8k_1 120 $G\nrun g16k_1 120 $G --max-num-batched-tokens 16384\nrun g8k_2 120 $G\nrun g16k_2 120 $G --max-num-batched-tokens 16384\nexit#' devrun/s8/call2.sh > /tmp/c2.sh; LIMIT=${LIMIT:-500} bash /tmp/c2.sh;;
esac
