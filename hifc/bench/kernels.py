"""``hifc bench kernels``: decode step time against the memory roofline, prefill against the
matrix rate, both limits measured in the same run.

Reference rates, measured first on the engine's device: the device-to-device copy rate ((read +
write) bytes / s of a large buffer copy) and the matrix rate (FLOP/s of a square ``torch.matmul``
in the engine's dtype).

Decode: one engine; for each batch size B, B requests of ``--context`` random token ids are
prefilled, ``--warmup`` steps run, then ``--steps`` timed ``LLMEngine.step()`` calls (scheduling,
input building, model, sampling) twice: back to back, synchronised only before the first and
after the last (``step_ms``, the steady-state interval between steps, in which asynchronous
scheduling hides a step's host work behind the device work of the next), and each synchronised
on its own (``synced_step_ms``, the median: host and device time of one step added up). The
floor is the bytes the step reads (the weights its matmuls use, lm_head included, plus the KV of
every sequence) moved at the copy rate. With CUDA graphs, each batch's graph is also timed alone
(``forward_ms``: the GPU part of the step); ``--profile`` lists its kernels, the step's host
functions and, on CUDA, the device timeline of a few more steps run back to back: kernels and
copies inside and between the graphs, and where the device idled (:mod:`hifc.bench.probes`).
Unless ``--num-gpu-blocks`` or ``--kv-cache-gib`` is given, the KV pool is sized for the largest
batch; where that does not fit the device, the engine sizes it from its free memory instead. A
batch the pool cannot hold is reported as skipped. Unless ``--max-num-batched-tokens`` is given,
the batches are admitted in steps of up to 65,536 tokens, or of one prompt where a pool given on
the command line leaves too little memory for such a step.

Prefill: one prompt of ``--prefill-len`` random token ids in one ``step()`` (one warm-up, then
``--prefill-repeats`` timed, median). FLOPs: 2 x decoder-layer parameters x tokens, the lm_head
for the one token whose logits are computed, and causal attention (QK^T and PV, half the square).
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import logging
import statistics
import time

from hifc.analysis.common import int_list, positive_int
from hifc.bench.costs import kv_bytes_per_token, prefill_flops, weight_bytes_read
from hifc.bench.power import ClockSampler, describe
from hifc.bench.probes import (copy_gbps, free_device_memory, graph_capture_info,
                               host_functions, matmul_rates, profile_kernels, replay_times,
                               step_timeline, sync)
from hifc.bench.workloads import fixed_requests
from hifc.config import add_engine_args, engine_config_from_args, named_with_overrides

logger = logging.getLogger(__name__)

DEFAULT_BATCHED_TOKENS = 65536  # tokens per prefill step while the decode batches are admitted
PROFILED_STEPS = 8  # decode steps after the timed ones that --profile runs under cProfile
TIMELINE_STEPS = 6  # and then, on CUDA, one more and these under torch's profiler


def register(subparsers) -> None:
    p = subparsers.add_parser("kernels", help="decode vs memory roofline, prefill vs matmul rate")
    p.add_argument("--batch-sizes", type=int_list, default=(1, 32, 128),
                   help="comma-separated decode batch sizes (the engine's max_num_seqs is the "
                        "largest)")
    p.add_argument("--context", type=positive_int, default=4096, help="prompt tokens per request")
    p.add_argument("--steps", type=positive_int, default=32, help="timed decode steps per batch")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed decode steps per batch")
    p.add_argument("--prefill-len", type=positive_int, default=8192,
                   help="tokens of the timed one-step prefill")
    p.add_argument("--prefill-repeats", type=positive_int, default=3, help="timed prefills")
    p.add_argument("--profile", action="store_true",
                   help="list the kernels of each batch's decode graph, longest first, the "
                        "host functions of a few more steps (cProfile), and on CUDA the device "
                        "timeline of a few more steps and the kernels of one more prefill")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    add_engine_args(p, model="random:ds-r1-llama-8b")
    p.set_defaults(func=run)


# ---- engine sizing --------------------------------------------------------------------------
def decode_max_tokens(batches, context: int, steps: int, warmup: int, batched_tokens: int) -> int:
    """New tokens per decode request: enough for every admission step, warm-up and timed step."""
    admit_steps = -(-max(batches) // max(1, batched_tokens // context))
    return admit_steps + warmup + 2 * steps + PROFILED_STEPS + TIMELINE_STEPS + 5


def kv_blocks(num_seqs: int, tokens_per_seq: int, block_size: int) -> int:
    # 3% above what the sequences hold: admission keeps a 1% free-block watermark
    return int(1.03 * num_seqs * -(-tokens_per_seq // block_size)) + 16


def sized_options(options: dict, batches, context: int, steps: int, warmup: int,
                  prefill_len: int = 0) -> dict:
    """Engine options (from ``options``) sized for the decode batches and, with prefill_len,
    one prefill of that many tokens in one step: max_model_len, max_num_seqs,
    max_num_batched_tokens and, unless a KV budget is given, num_gpu_blocks."""
    batched = options.get("max_num_batched_tokens") or max(DEFAULT_BATCHED_TOKENS, context + 1)
    decode_len = context + decode_max_tokens(batches, context, steps, warmup, batched)
    model_len = max(decode_len, prefill_len + 1)
    if options.get("max_model_len") is not None and options["max_model_len"] < model_len:
        raise ValueError(f"--max-model-len {options['max_model_len']} is below the {model_len} "
                         "tokens this run needs per sequence")
    model_len = options.get("max_model_len") or model_len
    if not options.get("max_num_batched_tokens"):
        batched = max(batched, model_len)
    if batched < model_len:
        raise ValueError(f"--max-num-batched-tokens {batched} is below max_model_len "
                         f"{model_len}: a prompt (up to --prefill-len) is prefilled in one step")
    sized = dict(options, max_model_len=model_len, max_num_seqs=max(batches),
                 max_num_batched_tokens=batched)
    if options.get("num_gpu_blocks") is None and options.get("kv_cache_gib") is None:
        block = options.get("block_size", 64)
        sized["num_gpu_blocks"] = max(kv_blocks(max(batches), decode_len, block),
                                      kv_blocks(1, prefill_len + 1, block))
    return sized


# ---- measurements ---------------------------------------------------------------------------
def measure_decode(engine, batch: int, context: int, steps: int, warmup: int,
                   max_tokens: int, profile: bool = False) -> tuple[dict, list[list[int]]]:
    """Decode step time with ``batch`` sequences of about ``context`` tokens; returns the row and
    each request's greedy tokens at the last timed step. The requests ask for delta outputs
    (each step returns its new tokens only), as a streaming server's do."""
    from hifc.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    prompts = fixed_requests(context, max_tokens, batch, engine.arch.vocab_size, seed=batch)
    for rid, request in zip(ids, prompts):
        engine.add_request(rid, request.prompt_token_ids, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}

    def step() -> int:
        outs = engine.step()
        for o in outs:
            tokens[o.request_id].extend(o.outputs[0].token_ids)
        return len(outs)

    while engine.scheduler.waiting:
        step()
    for _ in range(warmup):
        step()
    graph_steps0 = engine.stats()["graph_decode_steps"]

    def timed_step():
        decoded = step()
        if decoded != batch:
            raise RuntimeError(f"a timed step decoded {decoded} of {batch} sequences; "
                               "raise --num-gpu-blocks or lower the batch sizes")

    times = []
    for _ in range(steps):
        sync(engine.device)
        t0 = time.perf_counter()
        timed_step()
        sync(engine.device)
        times.append(time.perf_counter() - t0)
    sync(engine.device)
    with ClockSampler(engine.device) as clocks:
        t0 = time.perf_counter()
        for _ in range(steps):
            timed_step()
        sync(engine.device)
        steady_s = (time.perf_counter() - t0) / steps
    graph_steps = engine.stats()["graph_decode_steps"] - graph_steps0
    last = [list(tokens[rid]) for rid in ids]
    forward = replay_times(engine, batch, profile)
    if profile:  # after the timed steps: cProfile slows the steps it watches
        host = cProfile.Profile()
        host.runcall(lambda: [engine.step() for _ in range(PROFILED_STEPS)])
        forward["host_functions"] = host_functions(host, PROFILED_STEPS)
        if engine.device.type == "cuda":
            forward["timeline"] = step_timeline(
                lambda: [engine.step() for _ in range(TIMELINE_STEPS + 1)], TIMELINE_STEPS)
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    kv_read = batch * (context + warmup + steps) * kv_bytes_per_token(engine)
    row = {"batch": batch, "context": context, "steps": steps, "step_ms": 1000 * steady_s,
           "synced_step_ms": 1000 * statistics.median(times), "tokens_per_s": batch / steady_s,
           "graph_steps": graph_steps, "bytes_read": weight_bytes_read(engine) + kv_read,
           "clocks": clocks.summary(), **forward}
    return row, last


def add_floor(row: dict, copy_rate_gbps: float) -> dict:
    """The step's memory floor: its reads at the copy's (read + write) rate."""
    row["floor_ms"] = 1000 * row["bytes_read"] / (copy_rate_gbps * 1e9)
    row["step_over_floor"] = row["step_ms"] / row["floor_ms"]
    if "forward_ms" in row:
        row["forward_over_floor"] = row["forward_ms"] / row["floor_ms"]
    return row


def measure_prefill(engine, tokens: int, repeats: int, matmul_rate_tflops: float,
                    sustained_tflops: float, profile: bool = False) -> dict:
    """Median time of a one-step prefill of ``tokens`` random ids (after one warm-up), as a
    fraction of the burst and of the sustained matmul rate; with ``profile``, the kernels of
    one more such prefill (``kernels``)."""
    from hifc.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompts = fixed_requests(tokens, 1, repeats + 1 + profile, engine.arch.vocab_size,
                             seed=tokens)

    def prefill(i: int) -> float:
        rid = f"prefill-{i}"
        engine.add_request(rid, prompts[i].prompt_token_ids, params)
        sync(engine.device)
        t0 = time.perf_counter()
        outs = engine.step()
        if not outs:  # asynchronous scheduling: a step's outputs come with the next call
            outs = engine.step()
        sync(engine.device)
        if [o.request_id for o in outs] != [rid] or not outs[0].finished:
            raise RuntimeError(f"the {tokens}-token prefill did not finish in one step")
        return time.perf_counter() - t0

    prefill(0)  # warm-up
    with ClockSampler(engine.device) as clocks:
        times = [prefill(i) for i in range(1, repeats + 1)]
    seconds = statistics.median(times)
    tflops = prefill_flops(engine, tokens) / seconds / 1e12
    result = {"tokens": tokens, "seconds": seconds, "tflops": tflops,
              "fraction_of_matmul": tflops / matmul_rate_tflops,
              "fraction_of_sustained": tflops / sustained_tflops, "tokens_per_s": tokens / seconds,
              "clocks": clocks.summary()}
    if profile:
        result["kernels"] = profile_kernels(lambda: prefill(repeats + 1), top=20)
    return result


# ---- the command ----------------------------------------------------------------------------
def load_engine(options: dict, sized_pool: bool, sized_budget: bool, device):
    """The run's engine. If the pool the benchmark sized (``sized_pool``) for its largest batch
    does not fit the device, the engine sizes it itself (``gpu_memory_utilization``), and the
    batches that pool cannot hold are skipped. If a pool given on the command line leaves too
    little memory for a step of the benchmark's own admission budget (``sized_budget``), the
    budget shrinks to one prompt (max_model_len, or max_num_seqs where larger): the batches are
    admitted over more steps."""
    from hifc.engine.limits import KVPoolTooLarge, StepTooLarge
    from hifc.engine.llm_engine import LLMEngine
    try:
        return LLMEngine.from_options(**options)
    except KVPoolTooLarge as e:
        if sized_pool:
            logger.warning("%s; the pool was sized for the largest batch: sizing it from "
                           "--gpu-memory-utilization instead, and skipping the batches it "
                           "cannot hold", e)
            options = {k: v for k, v in options.items() if k != "num_gpu_blocks"}
        elif sized_budget and isinstance(e, StepTooLarge):
            budget = max(options["max_model_len"], options["max_num_seqs"])
            logger.warning("%s; admitting with max_num_batched_tokens %d instead", e, budget)
            options = dict(options, max_num_batched_tokens=budget)
        else:
            raise
    free_device_memory(device)  # the failed engine's weights
    return LLMEngine.from_options(**options)


def run(args: argparse.Namespace) -> int:
    from hifc.engine.gc_heap import frozen_heap
    from hifc.engine.limits import resolve_device, resolve_dtype

    config = engine_config_from_args(args)
    batches = list(args.batch_sizes)
    if not batches:
        raise ValueError("--batch-sizes is empty")
    device = resolve_device(config)
    dtype = resolve_dtype(config, device)
    options = sized_options(config.options(), batches, args.context, args.steps, args.warmup,
                            args.prefill_len)
    copy_rate = copy_gbps(device)
    matmul_rate, sustained_rate = matmul_rates(device, dtype)
    engine = load_engine(options, not config.kv_pool_given,
                         config.max_num_batched_tokens is None, device)
    max_tokens = decode_max_tokens(batches, args.context, args.steps, args.warmup,
                                   engine.limits.max_num_batched_tokens)
    pool = engine.kv_manager.num_total_blocks
    needs = {b: kv_blocks(b, args.context + max_tokens, config.block_size) for b in batches}
    if all(need > pool for need in needs.values()):
        raise ValueError(f"no batch of --batch-sizes fits the KV pool of {pool} blocks (batch "
                         f"{min(batches)} needs {needs[min(batches)]}): raise --num-gpu-blocks "
                         "or --kv-cache-gib, or lower --context")
    with frozen_heap():
        rows = [add_floor(measure_decode(engine, b, args.context, args.steps, args.warmup,
                                         max_tokens, args.profile)[0], copy_rate)
                if needs[b] <= pool else
                {"batch": b, "context": args.context,
                 "skipped": f"needs {needs[b]} KV blocks, the pool holds {pool}"}
                for b in batches]
        prefill = measure_prefill(engine, args.prefill_len, args.prefill_repeats, matmul_rate,
                                  sustained_rate, args.profile and engine.device.type == "cuda")
    result = {"model": engine.model_name, "hf_overrides": config.hf_overrides,
              "dtype": str(engine.dtype).removeprefix("torch."),
              "device": str(engine.device), "copy_gbps": copy_rate, "matmul_tflops": matmul_rate,
              "sustained_matmul_tflops": sustained_rate,
              "block_size": config.block_size,
              "max_num_batched_tokens": engine.limits.max_num_batched_tokens,
              "weight_bytes_read": weight_bytes_read(engine),
              "captured_sizes": graph_capture_info(engine)["captured_sizes"],
              "decode": rows, "prefill": prefill,
              "tuned_projections": [dataclasses.asdict(t)
                                    for t in engine.runner.tuned_projections]}
    print_result(result)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def print_timeline(t: dict | None) -> None:
    if not t:
        return
    print(f"{'':>8}device timeline of {t['steps']} steps back to back: {t['span_ms']:.3f} ms/step, "
          f"busy {t['busy_ms']:.3f}, idle {t['idle_ms']:.3f}")
    for k in t["kernels"]:
        print(f"{'':>8}{k['ms']:>8.3f} ms/step {k['calls']:>6.1f}x  {k['name'][:80]}")
    for g in t["idle"]:
        print(f"{'':>8}{g['us']:>8.1f} us/step idle {g['count']:>4.1f}x  "
              f"{str(g['after'])[:40]} -> {g['before'][:40]}")


def print_tuned(tuned: list[dict]) -> None:
    """The projections whose tuned kernel is not torch's (us per product)."""
    changed = [t for t in tuned if t["chosen"] != t["default"]]
    if tuned:
        earlier = sum(t.get("from_file", False) for t in tuned)
        print(f"tuned projections: {len(changed)} of {len(tuned)} shapes x rows take another "
              "kernel than torch's" + (f" ({earlier} timed by an earlier process)"
                                       if earlier else ""))
    for t in changed:
        print(f"{'':>8}{t['rows']:>6} x [{t['n']}, {t['k']}]  {t['default']} "
              f"{t['default_us']:.2f} us -> {t['chosen']} {t['chosen_us']:.2f} us")


def print_result(result: dict) -> None:
    print(f"model {named_with_overrides(result['model'], result.get('hf_overrides'))}  "
          f"dtype {result['dtype']}  device {result['device']}  "
          f"copy {result['copy_gbps']:.1f} GB/s (read+write)  matmul "
          f"{result['matmul_tflops']:.2f} TFLOP/s (sustained "
          f"{result['sustained_matmul_tflops']:.2f})  "
          f"graph sizes {result['captured_sizes'] or '-'}")
    print(f"{'batch':>6} {'context':>8} {'step ms':>9} {'synced ms':>9} {'tokens/s':>10} "
          f"{'floor ms':>9} {'step/floor':>10} {'graph steps':>11} {'forward ms':>10} "
          f"{'fwd/floor':>9}")
    for r in result["decode"]:
        if "skipped" in r:
            print(f"{r['batch']:>6} {r['context']:>8}  skipped: {r['skipped']}")
            continue
        fwd = (f"{r['forward_ms']:>10.2f} {r['forward_over_floor']:>9.2f}"
               if "forward_ms" in r else f"{'-':>10} {'-':>9}")
        print(f"{r['batch']:>6} {r['context']:>8} {r['step_ms']:>9.2f} "
              f"{r['synced_step_ms']:>9.2f} {r['tokens_per_s']:>10.1f} "
              f"{r['floor_ms']:>9.3f} {r['step_over_floor']:>10.2f} "
              f"{str(r['graph_steps']) + '/' + str(2 * r['steps']):>11} {fwd}")
        if r["clocks"]:
            print(f"{'':>8}steady steps: {describe(r['clocks'])}")
        for k in r.get("kernels", []):
            print(f"{'':>8}{k['ms']:>8.3f} ms {k['calls']:>4}x  {k['name'][:90]}")
        for f in r.get("host_functions", []):
            print(f"{'':>8}{f['ms_per_step']:>8.3f} ms/step host {f['calls']:>6}x  "
                  f"{f['function'][:80]}")
        print_timeline(r.get("timeline"))
    print_tuned(result.get("tuned_projections", []))
    p = result["prefill"]
    print(f"prefill {p['tokens']} tokens: {1000 * p['seconds']:.1f} ms, {p['tokens_per_s']:.0f} "
          f"tokens/s, {p['tflops']:.2f} TFLOP/s = {p['fraction_of_matmul']:.2f} of the matmul "
          f"rate, {p['fraction_of_sustained']:.2f} of the sustained rate")
    if p["clocks"]:
        print(f"{'':>8}{describe(p['clocks'])}")
    for k in p.get("kernels", []):
        print(f"{'':>8}{k['ms']:>8.3f} ms {k['calls']:>4}x  {k['name'][:90]}")
