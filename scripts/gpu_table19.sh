#!/usr/bin/env bash
# The paper's Table 19 (issue 16): latency-sensitive serving with the KV budget held to 4 GiB
# under a load that keeps the engine saturated, through `hifc serve` and `hifc bench serve`.
#
#   PYTHONPATH=$PWD bash scripts/gpu_table19.sh [OUTDIR]              # one H200, ~4-6 minutes
#   PYTHONPATH=$PWD bash scripts/gpu_table19.sh --device cpu [OUTDIR] # smoke run, tiny preset
#
# For each variant (none, dram, flash) it starts `hifc serve random:ds-r1-llama-8b` on a free
# loopback port (bf16, CUDA graphs, --kv-cache-gib 4: 512 blocks of 64 tokens, ~32k tokens),
# waits for /health, warms the server up (Triton compiles its prefill kernels on first use),
# runs `hifc bench serve` and stops the server. The variants differ only in where preempted
# sequences go: none = no tier (the paper's GPU-only baseline, which OOMs in vLLM; hifc
# preempts by recompute), dram = pinned DRAM (--swap-space), flash = a cache file in the
# current directory (--flash-size-gib; the flash prefix store off, so flash does only swaps).
# The load: 96 requests of 2048 random prompt tokens and 512 output tokens (greedy, EOS
# ignored), Poisson arrivals at 4 req/s (above the ~2 req/s the budget sustains), at most 32 in
# flight: ~15 sequences fit the budget at admission and their growth preempts some of them.
# Prints per variant the output throughput, e2e latency mean/p99, TTFT and TPOT mean/p99 and
# the preemptions, swapped blocks and recomputes of the benchmark (from /metrics, the warm-up
# subtracted), beside the paper's figures (HiFC 182 tok/s, 5.4 s; DRAM 172 tok/s, 5.8 s;
# GPU-only OOM). Writes OUTDIR/<variant>.json (hifc bench serve's, per request),
# OUTDIR/<variant>-metrics.json (the /metrics counters before and after), OUTDIR/server-*.log and
# OUTDIR/table19.json (the table). Exit status 1 if any variant's server or benchmark failed.
set -euo pipefail
device=cuda
if [[ ${1:-} == --device ]]; then device=$2; shift 2; fi
outdir=${1:-table19-$(date +%Y%m%d-%H%M)}
mkdir -p "$outdir"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
flash="$PWD/hifc-table19-$$.kv"
python3 -c "import fastapi, httpx, prometheus_client, uvicorn" \
  || { echo "needs httpx (hifc bench serve): pip install 'hifc[bench]'"; exit 2; }
server_pid=

stop_server() {  # SIGTERM, then SIGKILL if it has not exited after 30 s
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap 'stop_server; rm -f "$flash"' EXIT

if [[ $device == cpu ]]; then
  model=random:tiny-llama
  engine=(--device cpu --dtype float32 --block-size 16 --max-model-len 256 --max-num-seqs 8
          --num-gpu-blocks 24)
  tier_gib=0.05
  work=(--dataset random --input-len 64 --output-len 64 --num-prompts 16 --request-rate 50
        --max-concurrency 8)
  warmup=(--dataset random --input-len 64 --output-len 4 --num-prompts 2)
  start_timeout=180
else
  model=random:ds-r1-llama-8b
  engine=(--dtype bfloat16 --block-size 64 --max-model-len 4096 --max-num-seqs 32
          --kv-cache-gib 4)
  tier_gib=12  # more than the swapped KV can reach: ~17 preempted x 2.5k tokens x 128 KiB
  work=(--dataset random --input-len 2048 --output-len 512 --num-prompts 96 --request-rate 4
        --max-concurrency 32)
  warmup=(--dataset random --input-len 2048 --output-len 8 --num-prompts 4)
  start_timeout=420
fi

# wait_healthy URL PID TIMEOUT: poll URL/health until 200; fail if PID exits or time runs out
wait_healthy() {
  python3 - "$@" <<'EOF'
import os, sys
from hifc.bench.serve import wait_healthy
url, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def exited() -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False

try:
    wait_healthy(url, exited, timeout, poll_s=0.5)
except RuntimeError as exc:
    sys.exit(str(exc))
EOF
}

# scrape URL OUT.json: every sample of /metrics as {name{labels}: value}
scrape() {
  python3 - "$@" <<'EOF'
import json, sys
import httpx
from prometheus_client.parser import text_string_to_metric_families
values = {}
for family in text_string_to_metric_families(httpx.get(f"{sys.argv[1]}/metrics", timeout=30).text):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
json.dump(values, open(sys.argv[2], "w"), indent=1, sort_keys=True)
EOF
}

status=0
for variant in none dram flash; do
  case $variant in
    none) tier=(--kv-offload none) ;;
    dram) tier=(--kv-offload dram --swap-space "$tier_gib") ;;
    flash) tier=(--kv-offload flash --flash-path "$flash" --flash-size-gib "$tier_gib"
                 --prefix-store off) ;;
  esac
  port=$(python3 -c "from hifc.ports import free_port; print(free_port())")
  url=http://127.0.0.1:$port
  echo "=== $variant: hifc serve $model ${tier[*]} ($(date +%T))"
  started=$SECONDS
  python3 -m hifc.entrypoints.cli serve "$model" "${engine[@]}" "${tier[@]}" \
    --host 127.0.0.1 --port "$port" > "$outdir/server-$variant.log" 2>&1 &
  server_pid=$!
  if ! wait_healthy "$url" "$server_pid" "$start_timeout"; then
    tail -20 "$outdir/server-$variant.log"
    stop_server; status=1; continue
  fi
  echo "healthy after $((SECONDS - started)) s; warming up"
  bench=(python3 -m hifc.entrypoints.cli bench serve --base-url "$url")
  if ! "${bench[@]}" "${warmup[@]}" --seed 99 > "$outdir/warmup-$variant.txt" 2>&1; then
    cat "$outdir/warmup-$variant.txt"; stop_server; status=1; continue
  fi
  scrape "$url" "$outdir/$variant-metrics-before.json" || status=1
  "${bench[@]}" "${work[@]}" --seed 0 --json "$outdir/$variant.json" || status=1
  scrape "$url" "$outdir/$variant-metrics-after.json" || status=1
  stop_server
  rm -f "$flash"
done

python3 - "$outdir" <<'EOF' || status=1
"""The table: each variant's benchmark and its /metrics counters (after minus before)."""
import json
import os
import sys

outdir = sys.argv[1]
PAPER = {"none": "OOM", "dram": "172 tok/s, 5.8 s", "flash": "182 tok/s, 5.4 s"}
COUNTERS = {"preemptions": "vllm:num_preemptions_total", "swap_out": "hifc_swap_out_blocks_total",
            "swap_in": "hifc_swap_in_blocks_total", "recomputed": "hifc_recomputed_sequences_total",
            "swap_failures": "hifc_swap_failures_total",
            "stall_s": "hifc_swap_stall_seconds_total"}


def counter(values: dict, name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


rows, failed = [], False
for variant in ("none", "dram", "flash"):
    path = f"{outdir}/{variant}.json"
    if not os.path.exists(path):
        rows.append({"variant": variant, "error": "no result (see the server log)"})
        failed = True
        continue
    bench = json.load(open(path))
    scraped = {}
    for when in ("before", "after"):
        scrape_path = f"{outdir}/{variant}-metrics-{when}.json"
        if os.path.exists(scrape_path):
            scraped[when] = json.load(open(scrape_path))
            os.remove(scrape_path)
    json.dump(scraped, open(f"{outdir}/{variant}-metrics.json", "w"), indent=1)
    before, after = scraped.get("before", {}), scraped.get("after", {})
    row = {"variant": variant, "requests_ok": bench["requests_ok"],
           "requests_failed": bench["requests_failed"], "duration_s": bench["duration_s"],
           "output_tokens_per_s": bench["output_tokens_per_s"],
           "e2e_mean_s": (bench["e2e_ms"]["mean"] or 0) / 1000,
           "e2e_p99_s": (bench["e2e_ms"]["p99"] or 0) / 1000,
           "ttft_ms": bench["ttft_ms"], "tpot_ms": bench["tpot_ms"], "itl_ms": bench["itl_ms"],
           "peak_in_flight": bench["peak_in_flight"], "paper": PAPER[variant],
           **{key: counter(after, name) - counter(before, name)
              for key, name in COUNTERS.items()}}
    failed |= bench["requests_failed"] > 0 or bench["requests_ok"] == 0
    rows.append(row)

dram = next((r for r in rows if r["variant"] == "dram" and "error" not in r), None)
head = (f"{'variant':<8}{'ok/fail':>8}{'out tok/s':>10}{'x dram':>7}{'lat mean s':>11}"
        f"{'lat p99 s':>10}{'TTFT mean/p99 ms':>18}{'TPOT mean/p99 ms':>18}{'preempt':>8}"
        f"{'swap out/in blk':>16}{'recomp':>7}{'stall s':>8}  paper (tok/s, mean latency)")
print(head)
for r in rows:
    if "error" in r:
        print(f"{r['variant']:<8}  {r['error']}")
        continue
    ratio = (f"{r['output_tokens_per_s'] / dram['output_tokens_per_s']:.3f}"
             if dram and dram["output_tokens_per_s"] else "-")
    ttft, tpot = r["ttft_ms"], r["tpot_ms"]
    fmt = lambda d: "-" if d["mean"] is None else f"{d['mean']:.0f}/{d['p99']:.0f}"
    fmt_tpot = lambda d: "-" if d["mean"] is None else f"{d['mean']:.1f}/{d['p99']:.1f}"
    print(f"{r['variant']:<8}{r['requests_ok']:>4}/{r['requests_failed']:<3}"
          f"{r['output_tokens_per_s']:>10.1f}{ratio:>7}{r['e2e_mean_s']:>11.2f}"
          f"{r['e2e_p99_s']:>10.2f}{fmt(ttft):>18}{fmt_tpot(tpot):>18}{r['preemptions']:>8.0f}"
          f"{r['swap_out']:>8.0f}/{r['swap_in']:<7.0f}{r['recomputed']:>7.0f}"
          f"{r['stall_s']:>8.2f}  {r['paper']}")
print("paper (A100, vLLM 0.6.6, HBM limited to 4 GiB, heavy load): GPU-only OOM; "
      "HiFC 182 tok/s, 5.4 s mean latency; DRAM 172 tok/s, 5.8 s")
json.dump(rows, open(f"{outdir}/table19.json", "w"), indent=2)
sys.exit(1 if failed else 0)
EOF
echo "outputs in $outdir"
exit $status
