"""``hifc bench throughput``: offline throughput with and without KV swapping, side by side.

All requests are queued at once (like vLLM's offline throughput benchmark) and the engine runs
until they finish. ``--compare`` runs several variants of the same workload in one invocation:

  none       unconstrained GPU: the KV pool takes the free GPU memory (no preemption expected)
  dram       KV budget (--kv-cache-gib / --num-gpu-blocks), preemption swaps to pinned DRAM
  flash      same budget, preemption swaps to the flash tier (--flash-path)
  recompute  same budget, preemption drops the KV and recomputes it
  auto       same budget, flash tier, swap or recompute chosen per victim from measured costs

Each variant reports tokens/s, requests/s, swap counts and bytes, I/O and stall time, and its
throughput as a ratio to the DRAM variant (the paper's baseline) measured in the same run.
"""
from __future__ import annotations

import argparse
import gc
import json
import time

from tqdm.auto import tqdm

from hifc.bench.workloads import PROFILES, BenchRequest, fixed_requests, profile_requests
from hifc.entrypoints.engine_args import add_engine_args, engine_config_from_args

VARIANTS = ("none", "dram", "flash", "recompute", "auto")


def register(subparsers) -> None:
    p = subparsers.add_parser("throughput", help="offline throughput: swap tiers side by side")
    w = p.add_argument_group("workload")
    w.add_argument("--profile", choices=sorted(PROFILES), help="LongBench-like input lengths")
    w.add_argument("--input-len", type=int, help="fixed input length (instead of --profile)")
    w.add_argument("--output-len", type=int, help="output length (overrides the profile's)")
    w.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--compare", default="dram,flash",
                   help=f"comma-separated variants from {', '.join(VARIANTS)}")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--no-progress", action="store_true")
    add_engine_args(p, model_default="random:ds-r1-llama-8b")
    p.set_defaults(func=run)


def build_requests(args, vocab_size: int, max_model_len: int) -> list[BenchRequest]:
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be positive")
    if (args.profile is None) == (args.input_len is None):
        raise ValueError("give exactly one of --profile and --input-len")
    if args.profile:
        profile = PROFILES[args.profile]
        if args.output_len:
            profile = type(profile)(profile.name, profile.mean_input_tokens, args.output_len)
        return profile_requests(profile, args.num_prompts, vocab_size, max_model_len, args.seed)
    return fixed_requests(args.input_len, args.output_len or 128, args.num_prompts, vocab_size,
                          args.seed)


def variant_options(name: str, base: dict) -> dict:
    """Engine options of one variant, from the shared options (which carry the KV budget)."""
    opts = dict(base)
    if name == "none":
        opts.update(num_gpu_blocks=None, kv_cache_gib=None, kv_offload="none", preemption=None)
    elif name == "recompute":
        opts.update(kv_offload="none", preemption="recompute")
    elif name == "dram":
        opts.update(kv_offload="dram", preemption="swap",
                    swap_space=base.get("swap_space") or base.get("flash_size_gib"))
    else:
        if not base.get("flash_path") or not base.get("flash_size_gib"):
            raise ValueError(f"variant {name!r} needs --flash-path and --flash-size-gib")
        opts.update(kv_offload="flash", preemption="swap" if name == "flash" else "auto")
    return opts


def run_variant(name: str, options: dict, requests: list[BenchRequest], progress: bool) -> dict:
    from hifc.engine.llm_engine import LLMEngine
    from hifc.sampling_params import SamplingParams

    engine = LLMEngine.from_options(**options)
    try:
        for i, r in enumerate(requests):
            engine.add_request(f"{name}-{i}", r.prompt_token_ids,
                               SamplingParams(max_tokens=r.output_tokens, temperature=0.0,
                                              ignore_eos=True))
        bar = tqdm(total=len(requests), desc=name, unit="req", disable=not progress)
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            bar.update(sum(o.finished for o in engine.step()))
        elapsed = time.perf_counter() - t0
        bar.close()
        stats = engine.stats()
    finally:
        engine.close()
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    output_tokens = sum(r.output_tokens for r in requests)
    return {
        "variant": name, "elapsed_s": elapsed, "requests": len(requests),
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / elapsed,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / elapsed,
        "requests_per_s": len(requests) / elapsed,
        "block_bytes": engine.limits.block_bytes, "gpu_blocks_total": stats["gpu_blocks_total"],
        **{k: stats[k] for k in ("preemptions", "swap_out_blocks", "swap_in_blocks",
                                 "tier_bytes_written", "tier_bytes_read", "swap_io_seconds",
                                 "swap_stall_seconds", "recomputed_sequences", "swap_failures",
                                 "steps")},
    }


def _release_device_memory() -> None:
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.compare.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    base = vars(engine_config_from_args(args))
    if any(v != "none" for v in variants) and base["num_gpu_blocks"] is None \
            and base["kv_cache_gib"] is None:
        raise ValueError("give a KV budget (--kv-cache-gib or --num-gpu-blocks) that forces "
                         "preemption, for the variants other than 'none'")
    from hifc.loader import load_model  # noqa: F401  (fail early on a bad model name)

    requests = None
    results = []
    for name in variants:
        options = variant_options(name, base)
        if requests is None:
            from hifc.engine.llm_engine import LLMEngine
            probe = LLMEngine.from_options(**options)
            requests = build_requests(args, probe.arch.vocab_size, probe.limits.max_model_len)
            probe.close()
            del probe
            _release_device_memory()
        results.append(run_variant(name, options, requests, not args.no_progress))
        _release_device_memory()
    summary = summarize(results)
    print_table(summary, args)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


def summarize(results: list[dict]) -> dict:
    by_name = {r["variant"]: r for r in results}
    base = by_name.get("dram")
    for r in results:
        r["ratio_to_dram"] = (r["output_tokens_per_s"] / base["output_tokens_per_s"]
                              if base else None)
        r["tier_write_gibps"] = (r["tier_bytes_written"] / (1 << 30) / r["swap_io_seconds"]
                                 if r["swap_io_seconds"] else None)
    summary = {"variants": results}
    test = by_name.get("flash")
    ideal = by_name.get("none") or by_name.get("dram")
    if test and ideal:  # top-level keys read by `hifc stall` and `hifc endurance`
        summary.update(tps_ideal=ideal["output_tokens_per_s"],
                       tps_test=test["output_tokens_per_s"], elapsed_s=test["elapsed_s"],
                       swap_out_blocks=test["swap_out_blocks"], block_bytes=test["block_bytes"],
                       tier_bytes_written=test["tier_bytes_written"],
                       tier_write_gibps=test["tier_write_gibps"])
    return summary


def print_table(summary: dict, args) -> None:
    workload = (f"profile {args.profile}" if args.profile else
                f"input {args.input_len} / output {args.output_len or 128}")
    print(f"model {args.model}  {workload}  prompts {args.num_prompts}  "
          f"max_num_seqs {args.max_num_seqs}  block {args.block_size}")
    head = (f"{'variant':>9} {'out tok/s':>10} {'req/s':>7} {'x dram':>7} {'preempt':>7} "
            f"{'swap out':>8} {'swap in':>8} {'GiB wr':>7} {'GiB rd':>7} {'io s':>7} "
            f"{'stall s':>7} {'recomp':>6} {'fail':>4}")
    print(head)
    for r in summary["variants"]:
        ratio = f"{r['ratio_to_dram']:.3f}" if r["ratio_to_dram"] is not None else "-"
        print(f"{r['variant']:>9} {r['output_tokens_per_s']:>10.1f} {r['requests_per_s']:>7.3f} "
              f"{ratio:>7} {r['preemptions']:>7} {r['swap_out_blocks']:>8} "
              f"{r['swap_in_blocks']:>8} {r['tier_bytes_written'] / 2**30:>7.2f} "
              f"{r['tier_bytes_read'] / 2**30:>7.2f} {r['swap_io_seconds']:>7.2f} "
              f"{r['swap_stall_seconds']:>7.2f} {r['recomputed_sequences']:>6} "
              f"{r['swap_failures']:>4}")
