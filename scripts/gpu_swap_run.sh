#!/usr/bin/env bash
# Swap comparisons of the 8B preset on the GPU machine (issue 4), one device call each:
#   bash scripts/gpu_swap_run.sh OUTDIR fixed2k     fixed 2048 in / 1024 out, 24 prompts, 4 GiB KV:
#                                                   none, dram, flash, recompute, auto (~2 min),
#                                                   then flash through kvikio explicitly (~40 s)
#   bash scripts/gpu_swap_run.sh OUTDIR govreport   GovReport-like inputs (~9k tokens) with 2048
#                                                   output tokens, 16 prompts, 1400 blocks of 64:
#                                                   growth forces swaps (~5 min)
# (With 512 output tokens, as LongBench uses, ~9 admitted GovReport prompts leave room for their
# growth and nothing is preempted: docs/RESULTS.md.)
set -u -o pipefail
out=${1:?usage: bash scripts/gpu_swap_run.sh OUTDIR fixed2k|govreport}
shift
mkdir -p "$out"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
flash="$PWD/hifc-swap-$$.kv"
trap 'rm -f "$flash"' EXIT
# the step budget docs/RESULTS.md's runs had (the default on GPUs of 70 GiB or more is 16,384
# since)
bench=(python3 -m hifc.entrypoints.cli bench throughput --model random:ds-r1-llama-8b
       --no-progress --flash-path "$flash" --prefix-store off --max-num-batched-tokens 8192)
status=0
for workload in "$@"; do
  echo "=== $workload ($(date +%T))"
  case $workload in
    fixed2k)
      fixed=(--input-len 2048 --output-len 1024 --num-prompts 24 --max-num-seqs 24
             --kv-cache-gib 4 --swap-space 8 --flash-size-gib 8)
      "${bench[@]}" "${fixed[@]}" --compare none,dram,flash,recompute,auto \
        --json "$out/swap_fixed2k_8b.json" 2>&1 | grep -v '^INFO' || status=1
      "${bench[@]}" "${fixed[@]}" --compare flash --flash-backend kvikio \
        --json "$out/swap_fixed2k_8b_kvikio.json" 2>&1 | grep -v '^INFO' || status=1 ;;
    govreport)
      "${bench[@]}" --profile govreport --output-len 2048 --num-prompts 16 --max-num-seqs 16 \
        --num-gpu-blocks 1400 --swap-space 16 --flash-size-gib 16 \
        --compare none,dram,flash,recompute,auto --json "$out/swap_govreport2k_8b.json" 2>&1 \
        | grep -v '^INFO' || status=1 ;;
    *) echo "unknown workload $workload (fixed2k, govreport)"; status=2 ;;
  esac
  rm -f "$flash"
done
exit $status
