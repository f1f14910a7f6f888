"""Tensor parallelism on two GPUs (nvidia-h200-x2): parity with one GPU, and decode speed.

1. Greedy parity, float32 (where TP=1 and TP=2 differ only in summation order): a few prompts on
   TP=1, then on TP=2 (CUDA graphs on: decode replays graphs with the NCCL collectives inside),
   then on TP=2 with so few GPU blocks that sequences are preempted and swapped to flash (each
   rank its own file). Token ids must be identical; the script exits 1 otherwise.
2. Decode step time, bfloat16, TP=1 and TP=2 at batch 1/32/128 (``hifc bench kernels``'s
   measurement: median ``LLMEngine.step()``), against the memory floor of one rank: the bytes one
   GPU reads per step (its weight shard, lm_head rows included, and its KV heads of every
   sequence) at the copy rate measured on that GPU.

    PYTHONPATH=$PWD python3 scripts/gpu_tp_check.py                 # 8B preset, 2 GPUs
    PYTHONPATH=$PWD python3 scripts/gpu_tp_check.py --device cpu    # smoke: tiny preset, gloo
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

from hifc import LLM, SamplingParams
from hifc.analysis.common import int_list
from hifc.bench.kernels import (add_floor, decode_max_tokens, measure_decode,
                                 sized_options)
from hifc.bench.probes import copy_gbps
from hifc.engine.llm_engine import LLMEngine

PARITY_PROMPTS = 6


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--model", help="default: random:ds-r1-llama-8b (cuda), random:tiny-llama "
                                   "(cpu)")
    p.add_argument("--batch-sizes", type=int_list, help="default 1,32,128 (cuda), 1,4 (cpu)")
    p.add_argument("--context", type=int, help="prompt tokens per decode request "
                                               "(default 1024 cuda, 32 cpu)")
    p.add_argument("--steps", type=int, help="timed decode steps (default 16 cuda, 3 cpu)")
    p.add_argument("--parity-tokens", type=int, help="greedy tokens per parity prompt "
                                                      "(default 32 cuda, 8 cpu)")
    p.add_argument("--flash-dir", default=os.getcwd(),
                   help="where the swap run's cache files go (one per rank)")
    p.add_argument("--json", dest="json_out", help="write the results as JSON here")
    args = p.parse_args()
    cuda = args.device == "cuda"
    args.model = args.model or ("random:ds-r1-llama-8b" if cuda else "random:tiny-llama")
    args.batch_sizes = list(args.batch_sizes or ((1, 32, 128) if cuda else (1, 4)))
    args.context = args.context or (1024 if cuda else 32)
    args.steps = args.steps or (16 if cuda else 3)
    args.parity_tokens = args.parity_tokens or (32 if cuda else 8)
    if cuda and torch.cuda.device_count() < 2:
        sys.exit(f"TP=2 needs 2 GPUs; {torch.cuda.device_count()} visible")
    return args


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- 1. parity --------------------------------------------------------------------------------
def parity_prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (24 + 9 * i,), generator=gen).tolist()
            for i in range(PARITY_PROMPTS)]


def greedy(args, tp: int, **options) -> tuple[list[list[int]], dict, float]:
    params = SamplingParams(max_tokens=args.parity_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    llm = LLM(args.model, device=args.device, dtype="float32", tensor_parallel_size=tp,
              block_size=16, max_num_seqs=PARITY_PROMPTS, max_model_len=128, **options)
    try:
        prompts = parity_prompts(llm.engine.arch.vocab_size)
        outputs = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        stats = llm.stats()
    finally:
        llm.close()
        del llm
        release()
    return outputs, stats, time.perf_counter() - t0


def first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (s, t) in enumerate(zip(x, y)):
            if s != t:
                return f"prompt {i} token {j}: {s} vs {t}"
    return "-"


def run_parity(args) -> list[dict]:
    reference, _, seconds = greedy(args, 1, num_gpu_blocks=256)
    rows = [{"run": "TP=1 (reference)", "match": True, "seconds": seconds, "swap_out_blocks": 0}]
    flash = os.path.join(args.flash_dir, f"hifc-tp-check-{os.getpid()}.kv")
    runs = [("TP=2", dict(num_gpu_blocks=256)),
            ("TP=2 swapping to flash", dict(num_gpu_blocks=12, kv_offload="flash",
                                            flash_path=flash, flash_size_gib=0.5))]
    try:
        for name, options in runs:
            outputs, stats, seconds = greedy(args, 2, **options)
            rows.append({"run": name, "match": outputs == reference, "seconds": seconds,
                         "first_difference": first_difference(outputs, reference),
                         "swap_out_blocks": stats["swap_out_blocks"],
                         "recomputed": stats["recomputed_sequences"],
                         "graph_decode_steps": stats["graph_decode_steps"]})
    finally:
        for rank in (0, 1):
            path = flash if rank == 0 else f"{flash}.rank{rank}"
            if os.path.exists(path):
                os.unlink(path)
    return rows


# ---- 2. decode speed --------------------------------------------------------------------------
def run_decode(args, tp: int, copy_rate: float) -> list[dict]:
    options = sized_options(dict(model=args.model, device=args.device, dtype="auto",
                                 tensor_parallel_size=tp, block_size=64),
                            args.batch_sizes, args.context, args.steps, warmup=3)
    engine = LLMEngine.from_options(**options)
    try:
        max_tokens = decode_max_tokens(args.batch_sizes, args.context, args.steps, 3,
                                       options["max_num_batched_tokens"])
        rows = [add_floor(measure_decode(engine, b, args.context, args.steps, 3, max_tokens)[0],
                          copy_rate) for b in args.batch_sizes]
        memory = (torch.cuda.max_memory_allocated(engine.device) / 2**30
                  if engine.device.type == "cuda" else 0.0)
        for row in rows:
            row.update(tp=tp, rank0_peak_gib=memory)
    finally:
        engine.close()
        del engine
        release()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    return rows


def main() -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (shared GPU hosts)
    args = parse_args()
    t0 = time.perf_counter()
    print(f"model {args.model}  device {args.device}  torch {torch.__version__}")
    parity = run_parity(args)
    print(f"\ngreedy parity, float32, {PARITY_PROMPTS} prompts x {args.parity_tokens} tokens")
    print(f"{'run':<26} {'match':>6} {'swapped blocks':>15} {'recomputed':>10} "
          f"{'graph steps':>11} {'seconds':>8}  first difference")
    for r in parity:
        print(f"{r['run']:<26} {str(r['match']):>6} {r['swap_out_blocks']:>15} "
              f"{r.get('recomputed', 0):>10} {r.get('graph_decode_steps', '-'):>11} "
              f"{r['seconds']:>8.1f}  {r.get('first_difference', '-')}")
    copy_rate = copy_gbps(torch.device("cuda:0" if args.device == "cuda" else "cpu"))
    decode = run_decode(args, 1, copy_rate) + run_decode(args, 2, copy_rate)
    print(f"\ndecode, context {args.context}, {args.steps} timed steps; floor: one rank's "
          f"reads at {copy_rate:.0f} GB/s (copy rate, read+write)")
    print(f"{'TP':>3} {'batch':>6} {'step ms':>9} {'tokens/s':>10} {'floor ms':>9} "
          f"{'step/floor':>10} {'graph steps':>11} {'rank0 peak GiB':>15}")
    for r in decode:
        print(f"{r['tp']:>3} {r['batch']:>6} {r['step_ms']:>9.2f} {r['tokens_per_s']:>10.1f} "
              f"{r['floor_ms']:>9.3f} {r['step_over_floor']:>10.2f} "
              f"{str(r['graph_steps']) + '/' + str(r['steps']):>11} {r['rank0_peak_gib']:>15.1f}")
    by_batch = {(r["tp"], r["batch"]): r["step_ms"] for r in decode}
    print("TP=2 speed-up over TP=1: " + ", ".join(
        f"batch {b}: {by_batch[1, b] / by_batch[2, b]:.2f}x" for b in args.batch_sizes))
    ok = all(r["match"] for r in parity) and parity[-1]["swap_out_blocks"] > 0
    print(f"\n{'PASS' if ok else 'FAIL'}: TP=2 greedy parity with TP=1"
          f"{'' if parity[-1]['swap_out_blocks'] else ' (the swap run swapped nothing)'}; "
          f"{time.perf_counter() - t0:.0f} s in all")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": args.model, "parity": parity, "decode": decode,
                       "copy_gbps": copy_rate}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
