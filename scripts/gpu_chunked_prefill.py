"""Chunked prefill and the GPU prefix cache on a GPU: decode stalls, greedy parity, cache hits.

    PYTHONPATH=$PWD python3 scripts/gpu_chunked_prefill.py --json OUT/chunked_prefill.json
    PYTHONPATH=$PWD python3 scripts/gpu_chunked_prefill.py --device cpu     # smoke run, tiny

stall: per mode (--modes: chunked prefill off, then on with each budget, or budget:threshold
for a long_prefill_token_threshold beside the budget, or budget:threshold:pairs for a
prefill_attention_budget too), one engine
(random:ds-r1-llama-8b, bf16, Triton, decode CUDA graphs). 32 sequences with ~1k-token prompts
decode; after --warm-steps decode steps a 32k-token prompt is added. Every step's outputs time
the decoders' tokens: the inter-token latency of the 32 decoders from the long prompt's arrival
to their end (median, p99, max, p99/median: a one-step prefill stalls them all for one long
step), the median step with decodes only and p99 over it, and the long prompt's TTFT; then,
untimed, at a few points of the long prompt's prefill, ten steps under torch's profiler (wall
and kernel time per step) and ten under cProfile (the host functions). Each mode first runs the
same scenario on other random prompts, untimed, so that Triton compiles every kernel plan
before the clock starts.

parity: greedy token lists of prefix caching on / chunked prefill on / both, against both off,
on prompts in groups that share a long prefix (the 8B preset in bf16, and tiny-llama in fp32).
A matrix kernel's rounding depends on how many rows it runs at, so bf16 lists may part where two
logits nearly tie; the first divergence of each request is reported.

alone: one 64k-token prompt alone under chunked prefill (budget 8192): its TTFT with the
fused attention kernels for prompt chunks taken by their rule, never, and always.

hit: the same 8k-token prompt twice, one after the other: both TTFTs, the second's cached tokens
and the engine's prefix_cache_hits, and whether the two outputs are equal.

Exit status 1 if a parity list differs or a run leaves a GPU block held.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hifc import LLM, LLMEngine, SamplingParams  # noqa: E402
from hifc.bench import probes  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    model: str
    dtype: str
    block_size: int
    kv_cache_gib: float
    decoders: int
    decoder_prompt: int
    decoder_tokens: int
    warm_steps: int
    long_prompt: int
    long_tokens: int
    modes: tuple[str, ...]  # "off", "<budget>", "<budget>:<threshold>[:<attention pairs>]"
    parity_model_cases: tuple[tuple[str, str, str], ...]  # (name, model, dtype)
    parity_groups: int
    parity_per_group: int
    parity_prefix: int
    parity_tail: tuple[int, int]
    parity_tokens: int
    parity_budget: int
    hit_prompt: int
    alone_prompt: int  # the "alone" part's prompt
    alone_budget: int


GPU = Sizes(model="random:ds-r1-llama-8b", dtype="bfloat16", block_size=64, kv_cache_gib=24.0,
            decoders=32, decoder_prompt=1024, decoder_tokens=160, warm_steps=16,
            long_prompt=32768, long_tokens=8, modes=("off", "512", "2048"),
            # bf16 matmuls round by batch shape and random weights tie often: the float32 run
            # is the correctness signal
            parity_model_cases=(("8b bf16", "random:ds-r1-llama-8b", "bfloat16"),
                                ("8b fp32", "random:ds-r1-llama-8b", "float32")),
            parity_groups=4, parity_per_group=4, parity_prefix=1024, parity_tail=(50, 1500),
            parity_tokens=32, parity_budget=512, hit_prompt=8192, alone_prompt=65536,
            alone_budget=8192)
CPU = Sizes(model="random:tiny-llama", dtype="float32", block_size=16, kv_cache_gib=0.05,
            decoders=4, decoder_prompt=64, decoder_tokens=40, warm_steps=4,
            long_prompt=512, long_tokens=4, modes=("off", "64", "256:32", "256:0:4096"),
            parity_model_cases=(("tiny-llama fp32", "random:tiny-llama", "float32"),),
            parity_groups=2, parity_per_group=2, parity_prefix=48, parity_tail=(5, 60),
            parity_tokens=8, parity_budget=32, hit_prompt=256, alone_prompt=600,
            alone_budget=128)


def random_prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def released(engine: LLMEngine) -> bool:
    stats = engine.stats()
    return stats["gpu_blocks_free"] == stats["gpu_blocks_total"]


# ---- stall ---------------------------------------------------------------------------------------
def stall_scenario(engine: LLMEngine, sizes: Sizes, seed: int, tag: str) -> dict:
    """Decoders decode; the long prompt arrives mid-run. Returns the measured latencies."""
    rng = random.Random(seed)
    vocab = engine.arch.vocab_size
    decoders = [f"{tag}-d{i}" for i in range(sizes.decoders)]
    params = SamplingParams(max_tokens=sizes.decoder_tokens, temperature=0, ignore_eos=True)
    for rid in decoders:
        engine.add_request(rid, random_prompt(rng, sizes.decoder_prompt, vocab), params)
    arrivals: dict[str, list[float]] = {rid: [] for rid in decoders}
    # (seconds, while the long prompt prefilled, the decoders alone past their prompts)
    step_kinds: list[tuple[float, bool, bool]] = []
    long_id, long_added, long_first = f"{tag}-long", None, None
    while engine.has_unfinished_requests():
        if long_added is None and min(map(len, arrivals.values())) >= sizes.warm_steps:
            engine.add_request(long_id, random_prompt(rng, sizes.long_prompt, vocab),
                               SamplingParams(max_tokens=sizes.long_tokens, temperature=0,
                                              ignore_eos=True))
            long_added = time.perf_counter()
        alone = long_added is None and min(map(len, arrivals.values())) > 0
        t0 = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        step_kinds.append((now - t0, long_added is not None and long_first is None, alone))
        for out in outputs:
            if out.request_id in arrivals:
                arrivals[out.request_id].append(now)
            elif out.request_id == long_id and long_first is None:
                long_first = now
    gaps = [b - a for times in arrivals.values() for a, b in zip(times, times[1:])
            if a >= long_added]
    decode_only = [s for s, _, alone in step_kinds if alone]
    return {"itl_median_ms": 1e3 * statistics.median(gaps),
            "itl_p99_ms": 1e3 * quantile(gaps, 0.99), "itl_max_ms": 1e3 * max(gaps),
            "itl_samples": len(gaps),
            "p99_over_median": quantile(gaps, 0.99) / statistics.median(gaps),
            "decode_step_median_ms": 1e3 * statistics.median(decode_only),
            "p99_over_decode_step": quantile(gaps, 0.99) / statistics.median(decode_only),
            "steps_while_prefilling": sum(p for _, p, _ in step_kinds),
            "long_ttft_s": long_first - long_added,
            # every decoder still decoding when the long prompt's prefill ended: the gaps
            # cover all of it
            "decoders_outlast_prefill": min(times[-1] for times in arrivals.values())
            >= long_first}


def profile_chunk_steps(engine: LLMEngine, sizes: Sizes, marks: tuple[int, ...]) -> list[dict]:
    """The scenario again, untimed; from each of ``marks`` (steps into the long prompt's
    prefill) ten steps run under torch's profiler (wall and kernel time per step), then ten
    under cProfile (wall time and the host functions), with the long prompt's computed tokens
    there."""
    rng = random.Random(2)
    vocab = engine.arch.vocab_size
    params = SamplingParams(max_tokens=sizes.decoder_tokens, temperature=0, ignore_eos=True)
    ids = [f"prof-d{i}" for i in range(sizes.decoders)]
    for rid in ids:
        engine.add_request(rid, random_prompt(rng, sizes.decoder_prompt, vocab), params)
    for _ in range(sizes.warm_steps + 1):
        engine.step()
    engine.add_request("prof-long", random_prompt(rng, sizes.long_prompt, vocab),
                       SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    long_seq = next(s for s in engine.scheduler.waiting if s.request_id == "prof-long")
    rows, done = [], 0
    for mark in marks:
        while done < mark and long_seq.num_computed_tokens < sizes.long_prompt:
            engine.step()
            done += 1
        if long_seq.num_computed_tokens >= sizes.long_prompt:
            break
        context = long_seq.num_computed_tokens
        t0 = time.perf_counter()
        kernels = probes.profile_kernels(lambda: [engine.step() for _ in range(10)], top=10000)
        wall = (time.perf_counter() - t0) / 10
        done += 10
        host = cProfile.Profile()
        t0 = time.perf_counter()
        host.runcall(lambda: [engine.step() for _ in range(10)])
        cprofile_wall = (time.perf_counter() - t0) / 10
        done += 10
        rows.append({"prefill_step": mark, "context": context, "wall_ms": 1e3 * wall,
                     "kernel_ms": sum(k["ms"] for k in kernels) / 10,
                     "top": [(k["name"][:50], k["calls"] / 10, round(k["ms"] / 10, 3))
                             for k in kernels[:5]],
                     "cprofile_wall_ms": 1e3 * cprofile_wall,
                     "host": probes.host_functions(host, 10, top=15)})
    engine.abort_request(ids + ["prof-long"])
    while engine.has_unfinished_requests():
        engine.step()
    return rows


def run_stall(args, sizes: Sizes) -> list[dict]:
    rows = []
    for mode in sizes.modes:
        chunked = mode != "off"
        budget, threshold, pairs = (mode.split(":") + ["0", "0"])[:3]
        model_len = sizes.long_prompt + sizes.long_tokens + sizes.block_size
        budget = int(budget) if chunked else model_len
        threshold, pairs = int(threshold), int(pairs)
        options = dict(device=args.device, dtype=sizes.dtype, block_size=sizes.block_size,
                       kv_cache_gib=sizes.kv_cache_gib, max_model_len=model_len,
                       max_num_seqs=sizes.decoders + 8, enable_chunked_prefill=chunked,
                       max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
                       prefill_attention_budget=pairs)
        engine = LLMEngine.from_options(sizes.model, **options)
        stall_scenario(engine, sizes, seed=1000, tag="warm")  # compiles every kernel plan
        row = {"chunked_prefill": "on" if chunked else "off", "budget": budget,
               "long_prefill_token_threshold": threshold, "prefill_attention_budget": pairs,
               **stall_scenario(engine, sizes, seed=1, tag="run")}
        row["graph_chunk_steps"] = engine.stats()["graph_chunk_steps"]  # both scenarios
        row["graphs"] = probes.graph_capture_info(engine)
        if chunked and args.device == "cuda":
            row["profiled_steps"] = profile_chunk_steps(engine, sizes, (10, 100, 250))
        row["released"] = released(engine)
        rows.append(row)
        print(f"chunked {row['chunked_prefill']:<3} budget {budget:>6} threshold {threshold:>5}"
              f" pairs {pairs:>8}  ITL median "
              f"{row['itl_median_ms']:7.2f} ms  p99 {row['itl_p99_ms']:8.2f} ms  max "
              f"{row['itl_max_ms']:8.2f} ms  p99/median {row['p99_over_median']:5.2f}  "
              f"decode step {row['decode_step_median_ms']:6.2f} ms (p99 over it "
              f"{row['p99_over_decode_step']:5.2f})  long prompt TTFT "
              f"{row['long_ttft_s']:6.3f} s in {row['steps_while_prefilling']} steps, "
              f"{row['graph_chunk_steps']} chunk steps replayed (both runs); graphs "
              f"{row['graphs']['decode_graphs']} decode + {row['graphs']['chunk_graphs']} chunk, "
              f"captured in {row['graphs']['capture_seconds']:.1f} s, "
              f"{row['graphs']['capture_mib']:.0f} MiB", flush=True)
        for p in row.get("profiled_steps", []):
            print(f"  prefill step {p['prefill_step']:>4} (context {p['context']:>6}): wall "
                  f"{p['wall_ms']:6.2f} ms, kernels {p['kernel_ms']:6.2f} ms per step; top "
                  f"{p['top'][:3]}", flush=True)
            print(f"    under cProfile {p['cprofile_wall_ms']:6.2f} ms per step; host: "
                  + "; ".join(f"{h['function']} {h['ms_per_step']:.2f}" for h in p["host"]),
                  flush=True)
        del engine
        probes.free_device_memory(args.device)
    return rows


# ---- parity --------------------------------------------------------------------------------------
def parity_prompts(sizes: Sizes, vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    prompts = []
    for _ in range(sizes.parity_groups):
        prefix = random_prompt(rng, sizes.parity_prefix, vocab)
        prompts += [prefix + random_prompt(rng, rng.randint(*sizes.parity_tail), vocab)
                    for _ in range(sizes.parity_per_group)]
    return prompts + prompts[:1]  # and one prompt twice


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_parity(args, sizes: Sizes) -> list[dict]:
    variants = [("reference", False, False), ("prefix caching", True, False),
                ("chunked prefill", False, True), ("both", True, True)]
    rows = []
    for name, model, dtype in sizes.parity_model_cases:
        outputs, prompts = {}, None
        for variant, caching, chunked in variants:
            max_len = sizes.parity_prefix + sizes.parity_tail[1] + sizes.parity_tokens + 64
            llm = LLM(model, device=args.device, dtype=dtype, block_size=sizes.block_size,
                      kv_cache_gib=min(sizes.kv_cache_gib, 8.0), max_model_len=max_len,
                      max_num_seqs=32, enable_prefix_caching=caching,
                      enable_chunked_prefill=chunked,
                      max_num_batched_tokens=sizes.parity_budget if chunked else max_len)
            if prompts is None:
                prompts = parity_prompts(sizes, llm.engine.arch.vocab_size)
            params = SamplingParams(max_tokens=sizes.parity_tokens, temperature=0,
                                    ignore_eos=True)
            outputs[variant] = [o.token_ids for o in llm.generate(prompts, params,
                                                                  use_tqdm=False)]
            stats = llm.stats()
            if variant != "reference":
                ref = outputs["reference"]
                diverged = {i: first_divergence(r, o) for i, (r, o) in
                            enumerate(zip(ref, outputs[variant])) if r != o}
                row = {"case": name, "variant": variant, "requests": len(prompts),
                       "identical": len(prompts) - len(diverged), "first_divergence": diverged,
                       "prefix_cache_hits": stats["prefix_cache_hits"],
                       "prefix_cache_queries": stats["prefix_cache_queries"],
                       "steps": stats["steps"], "released": released(llm.engine)}
                rows.append(row)
                print(f"{name:<16} {variant:<16} identical {row['identical']:>3}/"
                      f"{row['requests']:<3} hits {row['prefix_cache_hits']:>6}/"
                      f"{row['prefix_cache_queries']:<6} steps {row['steps']:>4}"
                      + (f"  DIVERGED (request: first index) {diverged}" if diverged else ""),
                      flush=True)
            del llm
            probes.free_device_memory(args.device)
    return rows


# ---- hit -----------------------------------------------------------------------------------------
def ttft(engine: LLMEngine, rid: str, prompt: list[int], max_tokens: int) -> tuple[float, list]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.add_request(rid, prompt, params)
    t0, first, final = time.perf_counter(), None, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first is None:
                first = time.perf_counter() - t0
            final = out
    return first, final


def run_alone(args, sizes: Sizes) -> list[dict]:
    """One long prompt alone under chunked prefill: its TTFT with the Triton backend's fused
    kernels for prompt chunks taken by their rule (auto), never (paged) and always; each mode
    times a prompt of a length not seen before, after one a token shorter, untimed. With
    --alone-rounds N, N rounds, each starting one mode later than the one before (so that no
    mode is always the engine's first)."""
    length = sizes.alone_prompt
    engine = LLMEngine.from_options(sizes.model, device=args.device, dtype=sizes.dtype,
                                    block_size=sizes.block_size, kv_cache_gib=sizes.kv_cache_gib,
                                    max_model_len=length + 64,
                                    max_num_seqs=8, max_num_batched_tokens=sizes.alone_budget)
    backend = engine.runner.backend
    rng = random.Random(5)
    vocab = engine.arch.vocab_size
    rows = []
    modes = (("auto", None), ("paged", False), ("fused", True))
    order = [modes[(r + i) % len(modes)] for r in range(args.alone_rounds)
             for i in range(len(modes))]
    for mode, setting in order:
        if hasattr(backend, "dense_prefill"):  # the Triton backend (not the CPU's torch one)
            backend.dense_prefill = setting
        n = length - 2 * len(rows)
        ttft(engine, f"{mode}-warm", random_prompt(rng, n - 1, vocab), 1)
        seconds, _ = ttft(engine, mode, random_prompt(rng, n, vocab), 1)
        rows.append({"mode": mode, "round": len(rows) // len(modes),
                     "prompt_tokens": n, "budget": sizes.alone_budget,
                     "ttft_s": seconds, "backend": type(backend).__name__,
                     "released": released(engine)})
        print(f"alone: {n}-token prompt, budget {sizes.alone_budget}, fused kernels {mode:<5}  "
              f"TTFT {seconds * 1e3:9.1f} ms", flush=True)
    del engine
    probes.free_device_memory(args.device)
    return rows


def run_hit(args, sizes: Sizes) -> dict:
    model_len = sizes.hit_prompt + 64
    engine = LLMEngine.from_options(sizes.model, device=args.device, dtype=sizes.dtype,
                                    block_size=sizes.block_size,
                                    kv_cache_gib=min(sizes.kv_cache_gib, 8.0),
                                    max_model_len=model_len, max_num_batched_tokens=model_len)
    rng = random.Random(3)
    vocab = engine.arch.vocab_size
    ttft(engine, "warm", random_prompt(rng, sizes.hit_prompt, vocab), 4)  # compiles kernels
    prompt = random_prompt(rng, sizes.hit_prompt, vocab)
    before = engine.stats()["prefix_cache_hits"]
    first_s, first = ttft(engine, "first", prompt, 16)
    second_s, second = ttft(engine, "second", prompt, 16)
    row = {"prompt_tokens": len(prompt), "first_ttft_s": first_s, "second_ttft_s": second_s,
           "second_cached_tokens": second.num_cached_tokens,
           "prefix_cache_hits": engine.stats()["prefix_cache_hits"] - before,
           "same_output": first.token_ids == second.token_ids, "released": released(engine)}
    print(f"hit: {len(prompt)}-token prompt twice  TTFT first {first_s * 1e3:8.2f} ms  second "
          f"{second_s * 1e3:8.2f} ms ({first_s / second_s:5.1f}x)  cached "
          f"{row['second_cached_tokens']}  prefix_cache_hits {row['prefix_cache_hits']}  "
          f"same output {row['same_output']}", flush=True)
    del engine
    probes.free_device_memory(args.device)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run on tiny presets")
    parser.add_argument("--parts", default="stall,parity,hit")
    parser.add_argument("--modes", help="the stall part's modes, comma-separated: off, a "
                        "chunked prefill budget, or budget:long_prefill_token_threshold"
                        "[:prefill_attention_budget] (default off,512,2048 on cuda)")
    parser.add_argument("--decoder-tokens", type=int, help="tokens each decoder generates "
                        "(default 160 on cuda): more keep them decoding past a long prefill")
    parser.add_argument("--alone-rounds", type=int, default=1, help="rounds of the alone "
                        "part's three modes, each round starting one mode later")
    parser.add_argument("--json")
    args = parser.parse_args()
    sizes = GPU if args.device == "cuda" else CPU
    if args.modes:
        sizes = dataclasses.replace(sizes, modes=tuple(args.modes.split(",")))
    if args.decoder_tokens:
        sizes = dataclasses.replace(sizes, decoder_tokens=args.decoder_tokens)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("needs a CUDA GPU (or --device cpu)", file=sys.stderr)
            return 2
        print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    parts = args.parts.split(",")
    result, t0 = {"device": args.device, "sizes": sizes.__dict__}, time.perf_counter()
    runners = {"stall": run_stall, "parity": run_parity, "hit": run_hit, "alone": run_alone}
    for part in parts:
        start = time.perf_counter()
        result[part] = runners[part](args, sizes)
        print(f"[{part} took {time.perf_counter() - start:.0f} s]", flush=True)
    result["seconds"] = time.perf_counter() - t0
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    rows = (result.get("stall", []) + result.get("parity", []) + [result.get("hit", {})]
            + result.get("alone", []))
    ok = all(r.get("released", True) for r in rows)
    ok &= all(not r["first_divergence"] for r in result.get("parity", []))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
