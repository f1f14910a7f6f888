"""``hifc bench prefix``: prefix caching with and without the flash prefix store, side by side.

The workloads (:mod:`hifc.bench.conversations`: ShareGPT multi-turn conversations, and
requests sharing one system prompt) run one after the other on a fresh engine per variant
(the GPU cache is cold for the first; the second finds only the first's unrelated blocks),
with the same KV budget (small enough that the GPU cache evicts):

  none           prefix caching off
  gpu            the GPU prefix cache alone
  flash          GPU cache + flash prefix store (a new cache file)
  flash-restart  a new engine on the file the ``flash`` variant left (cold GPU, warm file)

Every variant preempts by recompute (so that only caching differs). Requests arrive turn by
turn: ``--max-concurrency`` conversations are active at once, and each submits its next turn
as soon as the previous one has finished (the conversation so far plus the generated tokens
and the next user message). TTFT is the time from ``add_request`` to the step that returns the
request's first token. Each engine first serves, untimed, two reversed prompts of the workload
(kernel compilation; nothing the timed run could find cached). Reported per variant: TTFT
p50/p99 and its ratio to ``none``, throughput, GPU and flash hit rates, the cost rule's
choices (tokens read, tokens recomputed), bytes read and written, the KV bytes per token, the
measured tier read bandwidth and prefill speed, and whether the greedy outputs of every turn
equal those of ``none``; JSON and a PNG.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Callable

from hifc.bench.conversations import (WORKLOADS, Caps, Dialogue, describe, multi_turn,
                                      read_exchanges, system_prompt)
from hifc.bench.probes import free_device_memory
from hifc.bench.workloads import token_lengths
from hifc.config import add_engine_args, engine_config_from_args

VARIANTS = ("none", "gpu", "flash", "flash-restart")
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "prefix_store_queries",
            "prefix_store_hits", "prefix_store_read_tokens", "prefix_store_recomputed",
            "prefix_store_reads", "prefix_store_read_failures", "prefix_store_bytes_read",
            "prefix_store_bytes_written", "prefix_store_evicted_unstored", "preemptions")


def register(subparsers) -> None:
    p = subparsers.add_parser("prefix", help="prefix caching: none, GPU, GPU + flash store, "
                                             "and after a restart, side by side")
    w = p.add_argument_group("workloads")
    w.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated, from {', '.join(WORKLOADS)}")
    w.add_argument("--num-conversations", type=int, default=16, help="multi-turn conversations")
    w.add_argument("--max-turns", type=int, default=4)
    w.add_argument("--max-turn-tokens", type=int, default=512,
                   help="cap on a user message's tokens")
    w.add_argument("--max-output-tokens", type=int, default=64, help="cap on a reply's tokens")
    w.add_argument("--num-requests", type=int, default=32, help="system-prompt requests")
    w.add_argument("--system-prompt-len", type=int, default=2048)
    w.add_argument("--max-concurrency", type=int, default=8,
                   help="conversations (requests) active at once")
    w.add_argument("--sharegpt-path", help="a ShareGPT-format JSON file instead of the package's")
    w.add_argument("--sharegpt-max-records", type=int, default=2000,
                   help="read this many records from the start of the file")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)} (flash-restart after flash)")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--plot", help="write a PNG of TTFT and throughput here")
    add_engine_args(p, model="random:ds-r1-llama-8b")
    p.set_defaults(func=run)


# ---- arguments -----------------------------------------------------------------------------
def parse_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in items if v not in allowed]
    if unknown or not items or len(set(items)) != len(items):
        raise ValueError(f"{what} must be distinct names from {', '.join(allowed)}, got {text!r}")
    return items


def check_args(args, variants: list[str], base: dict) -> None:
    for name in ("num_conversations", "max_turns", "max_turn_tokens", "max_output_tokens",
                 "num_requests", "system_prompt_len", "max_concurrency",
                 "sharegpt_max_records"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    if base["num_gpu_blocks"] is None and base["kv_cache_gib"] is None:
        raise ValueError("give a KV budget (--num-gpu-blocks or --kv-cache-gib) small enough "
                         "that the GPU prefix cache evicts")
    if any(v.startswith("flash") for v in variants) and not (base.get("flash_path")
                                                            and base.get("flash_size_gib")):
        raise ValueError("the flash variants need --flash-path and --flash-size-gib")
    if "flash-restart" in variants and "flash" not in variants:
        raise ValueError("flash-restart reopens the file the flash variant leaves: list both")
    if base.get("prefix_store") == "off" and any(v.startswith("flash") for v in variants):
        raise ValueError("the flash variants need the prefix store (--prefix-store not off)")


def variant_options(name: str, base: dict) -> dict:
    opts = dict(base, preemption="recompute")
    if name == "none":
        opts.update(enable_prefix_caching=False, kv_offload="none")
    elif name == "gpu":
        opts.update(enable_prefix_caching=True, kv_offload="none")
    else:
        opts.update(enable_prefix_caching=True, kv_offload="flash")
    return opts


# ---- one run ---------------------------------------------------------------------------------
@dataclass
class _Active:
    index: int  # of the dialogue in the workload
    dialogue: Dialogue
    turn: int
    history: list[int]
    prompt: list[int]
    added_at: float
    first_token_at: float | None = None


def drive(engine, dialogues: list[Dialogue], concurrency: int, tag: str) -> dict:
    """Serve the dialogues turn by turn; per-request TTFTs and the run's token counts."""
    from hifc.sampling_params import SamplingParams

    waiting, active = deque(enumerate(dialogues)), {}
    ttfts, prompt_tokens, output_tokens, ids = [], 0, 0, iter(range(1 << 62))
    generated: dict[str, list[int]] = {}  # "dialogue/turn" -> the greedy output

    def submit(index: int, dialogue: Dialogue, turn: int, history: list[int]) -> None:
        nonlocal prompt_tokens
        step = dialogue.turns[turn]
        prompt = history + step.user_ids
        rid = f"{tag}-{next(ids)}"
        engine.add_request(rid, prompt, SamplingParams(max_tokens=step.output_tokens,
                                                       temperature=0.0, ignore_eos=True))
        active[rid] = _Active(index, dialogue, turn, history, prompt, time.perf_counter())
        prompt_tokens += len(prompt)

    start = time.perf_counter()
    while waiting or active:
        while waiting and len(active) < concurrency:
            submit(*waiting.popleft(), 0, [])
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            state = active[out.request_id]
            if state.first_token_at is None and out.token_ids:
                state.first_token_at = now
                ttfts.append(now - state.added_at)
            if out.finished:
                del active[out.request_id]
                output_tokens += len(out.token_ids)
                generated[f"{state.index}/{state.turn}"] = out.token_ids
                if state.turn + 1 < len(state.dialogue.turns):
                    submit(state.index, state.dialogue, state.turn + 1,
                           state.prompt + out.token_ids)
    elapsed = time.perf_counter() - start
    while engine.has_unfinished_requests():  # prefix writes still in flight
        engine.step()
    digest = hashlib.sha256(json.dumps(generated, sort_keys=True).encode()).hexdigest()
    return {"elapsed_s": elapsed, "ttft_s": ttfts, "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens, "outputs_sha256": digest}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_variant(engine, name: str, dialogues: list[Dialogue], concurrency: int,
                label: str) -> dict:
    _warm_up(engine, dialogues, label + name)
    before = engine.stats()
    run = drive(engine, dialogues, concurrency, f"{label}{name}")
    after = engine.stats()
    counts = {k: after[k] - before[k] for k in COUNTERS}
    ttft = run.pop("ttft_s")
    elapsed = run["elapsed_s"]
    return {"variant": name, **run, **counts,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "ttft_mean_s": sum(ttft) / len(ttft), "requests": len(ttft),
            "output_tokens_per_s": run["output_tokens"] / elapsed,
            "total_tokens_per_s": (run["prompt_tokens"] + run["output_tokens"]) / elapsed,
            "gpu_hit_rate": _ratio(counts["prefix_cache_hits"], run["prompt_tokens"]),
            "flash_hit_rate": _ratio(counts["prefix_store_hits"], run["prompt_tokens"]),
            "flash_read_rate": _ratio(counts["prefix_store_read_tokens"], run["prompt_tokens"]),
            "prefill_tokens_per_s": after["prefill_tokens_per_s"],
            "tier_read_bytes_per_s": after["tier_read_bytes_per_s"]}


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _warm_up(engine, dialogues: list[Dialogue], tag: str) -> None:
    """Untimed: two reversed first turns (the workload's shapes), each after a token that
    names the variant: nothing the timed run, or a later variant on the same file, finds.
    Then the same prompts a block longer, which find the first ones in the GPU prefix cache:
    the kernels of a prefill over a cached context are compiled here, not in the timed run."""
    from hifc.sampling_params import SamplingParams

    mark = zlib.crc32(tag.encode()) % engine.arch.vocab_size
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    room = engine.limits.max_model_len - engine.config.block_size - 3
    prompts = [[mark] + d.turns[0].user_ids[::-1][:room] for d in dialogues[:2]]
    for round_index, extra in enumerate((0, engine.config.block_size)):
        for i, prompt in enumerate(prompts):
            engine.add_request(f"{tag}-warmup-{round_index}-{i}", prompt + [mark] * extra, params)
        while engine.has_unfinished_requests():
            engine.step()


# ---- the command ---------------------------------------------------------------------------
def build_workloads(args, engine, names: list[str]) -> dict[str, list[Dialogue]]:
    """The workloads, for the model and max_model_len of ``engine`` (the first one built)."""
    caps = Caps(args.max_turns, args.max_turn_tokens, args.max_output_tokens,
                engine.limits.max_model_len)
    exchanges = read_exchanges(args.sharegpt_path, args.sharegpt_max_records)
    lengths = token_lengths(engine.tokenizer)
    vocab_size, seed = engine.arch.vocab_size, engine.config.seed
    out = {}
    if "multi-turn" in names:
        out["multi-turn"] = multi_turn(exchanges, args.num_conversations, lengths, caps,
                                       vocab_size, seed)
    if "system-prompt" in names:
        out["system-prompt"] = system_prompt(exchanges, args.num_requests,
                                             args.system_prompt_len, lengths, caps,
                                             vocab_size, seed)
    return out


WorkloadBuilder = Callable[[object], dict[str, list[Dialogue]]]


def compare(base: dict, make_workloads: WorkloadBuilder, variants: list[str],
            concurrency: int, on_result: Callable[[dict], None] | None = None) -> dict:
    """Run the workloads, one after the other, on a fresh engine per variant (the workloads
    are built from the first engine). Returns {workload: {"workload": description,
    "variants": rows}, ...} and "kv": the KV bytes per token and per block."""
    engine = _new_engine(variants[0], base)
    try:
        workloads = make_workloads(engine)
    except BaseException:
        engine.close()
        raise
    block_bytes = engine.limits.block_bytes
    results: dict = {"kv": {"kv_bytes_per_block": block_bytes,
                            "kv_bytes_per_token": block_bytes // engine.config.block_size}}
    for workload, dialogues in workloads.items():
        results[workload] = {"workload": describe(dialogues), "variants": []}
    for name in variants:
        engine = engine or _new_engine(name, base)
        try:
            for workload, dialogues in workloads.items():
                rows = results[workload]["variants"]
                rows.append(run_variant(engine, name, dialogues, concurrency, f"{workload}-"))
                _add_ratios(rows)
                if on_result is not None:
                    on_result(results)
        finally:
            engine.close()
            engine = None
            free_device_memory()
    return results


def _new_engine(name: str, base: dict):
    from hifc.engine.llm_engine import LLMEngine

    if name == "flash" and os.path.exists(base["flash_path"]):
        os.unlink(base["flash_path"])  # the flash variant starts with an empty store
    return LLMEngine.from_options(**variant_options(name, base))


def _add_ratios(rows: list[dict]) -> None:
    none = next((r for r in rows if r["variant"] == "none"), None)
    for r in rows:
        r["ttft_p50_x_none"] = r["ttft_p50_s"] / none["ttft_p50_s"] if none else None
        r["ttft_p99_x_none"] = r["ttft_p99_s"] / none["ttft_p99_s"] if none else None
        r["throughput_x_none"] = (r["output_tokens_per_s"] / none["output_tokens_per_s"]
                                  if none else None)
        # greedy outputs equal those without caching (every turn of every conversation)
        r["outputs_match_none"] = r["outputs_sha256"] == none["outputs_sha256"] if none else None


def run(args: argparse.Namespace) -> int:
    base = engine_config_from_args(args).options()
    variants = parse_list(args.variants, VARIANTS, "--variants")
    names = parse_list(args.workloads, WORKLOADS, "--workloads")
    check_args(args, variants, base)

    def save(results: dict) -> dict:
        summary = {"settings": {k: v for k, v in base.items() if k != "tier_fault_injection"},
                   "variants": variants, **results.get("kv", {}),
                   "results": {k: v for k, v in results.items() if k != "kv"}}
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=2)
        return summary

    results = compare(base, lambda engine: build_workloads(args, engine, names), variants,
                      args.max_concurrency, save)
    summary = save(results)
    print_table(summary)
    if args.plot:
        from hifc.bench.prefix_plot import plot_prefix
        plot_prefix(summary, args.plot)
    return 0


_COLUMNS = (
    ("variant", 14, lambda r: r["variant"]),
    ("TTFT p50 s", 10, lambda r: f"{r['ttft_p50_s']:.3f}"),
    ("x none", 6, lambda r: "-" if r["ttft_p50_x_none"] is None else f"{r['ttft_p50_x_none']:.2f}"),
    ("TTFT p99 s", 10, lambda r: f"{r['ttft_p99_s']:.3f}"),
    ("x none", 6, lambda r: "-" if r["ttft_p99_x_none"] is None else f"{r['ttft_p99_x_none']:.2f}"),
    ("out tok/s", 9, lambda r: f"{r['output_tokens_per_s']:.1f}"),
    ("gpu hit", 7, lambda r: f"{r['gpu_hit_rate']:.2f}"),
    ("flash hit", 9, lambda r: f"{r['flash_hit_rate']:.2f}"),
    ("read tok", 8, lambda r: r["prefix_store_read_tokens"]),
    ("recomp tok", 10, lambda r: r["prefix_store_recomputed"]),
    ("GiB rd", 6, lambda r: f"{r['prefix_store_bytes_read'] / 2**30:.2f}"),
    ("GiB wr", 6, lambda r: f"{r['prefix_store_bytes_written'] / 2**30:.2f}"),
    ("rd GiB/s", 8, lambda r: _gibps(r["tier_read_bytes_per_s"])),
    ("prefill tok/s", 13, lambda r: f"{r['prefill_tokens_per_s'] or 0:.0f}"),
    ("same out", 8, lambda r: {True: "yes", False: "NO", None: "-"}[r["outputs_match_none"]]),
)


def _gibps(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 2**30:.2f}"


def print_table(summary: dict) -> None:
    s = summary["settings"]
    print(f"model {s['model']}  block {s['block_size']}  KV {summary['kv_bytes_per_token']} "
          f"bytes/token ({summary['kv_bytes_per_block'] / 2**20:.2f} MiB/block)  prefix_store "
          f"{s['prefix_store']}  read rule {s['prefix_store_read']}")
    for workload, result in summary["results"].items():
        w = result["workload"]
        print(f"{workload}: {w['conversations']} conversations, {w['requests']} requests, "
              f"user {w['user_tokens_mean']:.0f} / output {w['output_tokens_mean']:.0f} tokens "
              "mean")
        print(" ".join(f"{name:>{width}}" for name, width, _ in _COLUMNS))
        for r in result["variants"]:
            print(" ".join(f"{cell(r):>{width}}" for _, width, cell in _COLUMNS))
