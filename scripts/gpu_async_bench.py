"""Asynchronous scheduling on one GPU: decode tokens/s with ``async_scheduling`` off and on, and
the outputs of both compared on the device, in one run.

    PYTHONPATH=$PWD python3 scripts/gpu_async_bench.py [--json OUT.json]
    PYTHONPATH=$PWD python3 scripts/gpu_async_bench.py --device cpu   # smoke: tiny preset

One engine (default: random:ds-r1-llama-8b, bf16, CUDA graphs of the decode steps), switched
between the two modes between measurements (``LLMEngine.async_scheduling``). For each batch size
(--batches, default 1,32,64,128) and variant, the batch's requests of --context random prompt
tokens are prefilled, --warmup decode steps run, then --steps timed ``LLMEngine.step()`` calls
with every request decoding (scheduling, inputs, the graph replay, the sampler, outputs). Off
and on alternate over --repeats rounds so that drift hits both alike; medians are reported.
Variants (gpu_sampling_bench.py's):

- plain: temperature 1.0, nothing else;
- features: temperature 1.0 with logprobs=5, presence 0.5, frequency 0.5, repetition 1.1
  penalties, min_p 0.05 and a seed per request.

Columns: tokens/s and ms per step off and on, the speedup; and, per step, the host time spent
queueing the step (``ModelRunner.launch``) and waiting for a step's tokens
(``LaunchedStep.result``). With async on, the launch is what the host still adds in front of the
device; the wait is host time left idle (the device is the bottleneck, host work is hidden).

Checks on the device, after a pass that warms the prefix cache so that both modes see the same
batches:
- identity: a batch of greedy and seeded-features requests with staggered lengths
  (ignore_eos): tokens and logprobs identical off and on (bitwise);
- stops: greedy requests that stop at a stop token in the middle of the batch: identical
  requests counted. Informational: under async scheduling a stopped sequence still computes
  (and drops) one more token, so the next step's batch has more rows, and a bf16 matrix kernel
  may round differently for another row at a different batch size;
- syncs: synchronizing CUDA calls inside ``ModelRunner.launch`` (torch's sync debug mode) over a
  few decode steps of each variant: 0 expected (CUDA only).

PASS when the identity check holds and no launch synchronizes.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hifc import LLMEngine, SamplingParams  # noqa: E402
from hifc.bench.probes import sync  # noqa: E402

FEATURES = dict(logprobs=5, presence_penalty=0.5, frequency_penalty=0.5,
                repetition_penalty=1.1, min_p=0.05, seed=1234)
VARIANTS = {"plain": dict(temperature=1.0), "features": dict(temperature=1.0, **FEATURES)}
MODES = {"off": False, "on": True}


class HostTimes:
    """Host seconds spent in ``runner.launch`` and in ``LaunchedStep.result``, and, while
    ``count_syncs`` is set, the synchronizing CUDA calls inside launch (sync debug mode)."""

    def __init__(self, engine: LLMEngine):
        self.launch_s = 0.0
        self.wait_s = 0.0
        self.count_syncs = False
        self.syncs: list[str] = []
        self._launch = engine.runner.launch
        engine.runner.launch = self._timed_launch

    def reset(self) -> None:
        self.launch_s = self.wait_s = 0.0

    def _timed_launch(self, *args, **kwargs):
        t0 = time.perf_counter()
        if self.count_syncs:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step = self._launch(*args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            # torch warns "called a synchronizing CUDA operation" per sync (and, once, that
            # the debug mode is a prototype: not a sync)
            self.syncs += [str(w.message).splitlines()[0] for w in caught
                           if "called a synchronizing" in str(w.message)]
        else:
            step = self._launch(*args, **kwargs)
        self.launch_s += time.perf_counter() - t0
        result = step.result

        def timed_result():
            t1 = time.perf_counter()
            out = result()
            self.wait_s += time.perf_counter() - t1
            return out

        step.result = timed_result
        return step


def _prompts(batch: int, context: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(context)] for _ in range(batch)]


def _params(variant: dict, max_tokens: int, index: int) -> SamplingParams:
    """The variant's parameters for request ``index`` (its own seed where seeded)."""
    options = dict(variant)
    if "seed" in options:
        options["seed"] += index
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **options)


def _drain(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def measure(engine: LLMEngine, timers: HostTimes, tag: str, variant: dict,
            prompts: list[list[int]], warmup: int, steps: int) -> dict:
    """Decode tokens/s of ``steps`` step() calls with every request decoding, and the host time
    per step spent launching and waiting."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, _params(variant, warmup + steps + 4, i))
    while engine.scheduler.waiting or any(  # prefill (in chunks, if it must)
            not seq.output_token_ids for seq in engine.scheduler.running):
        engine.step()
    for _ in range(warmup):
        engine.step()
    sync(engine.device)
    timers.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(engine.device)
    elapsed = time.perf_counter() - t0
    launch_ms, wait_ms = 1000 * timers.launch_s / steps, 1000 * timers.wait_s / steps
    _drain(engine)
    return {"tokens_per_s": len(prompts) * steps / elapsed, "step_ms": 1000 * elapsed / steps,
            "launch_ms": launch_ms, "wait_ms": wait_ms}


def throughput(engine: LLMEngine, timers: HostTimes, batches: list[int], context: int,
               warmup: int, steps: int, repeats: int) -> list[dict]:
    prompts = _prompts(max(batches), context, engine.arch.vocab_size, seed=0)
    rows = []
    for batch in batches:
        for name, variant in VARIANTS.items():
            runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
            for r in range(repeats):
                for mode, on in MODES.items():
                    engine.async_scheduling = on
                    runs[mode].append(measure(engine, timers, f"b{batch}-{name}-{mode}-{r}",
                                              VARIANTS[name], prompts[:batch], warmup, steps))
            row = {"batch": batch, "variant": name}
            for mode in MODES:
                for key in ("tokens_per_s", "step_ms", "launch_ms", "wait_ms"):
                    row[f"{key}_{mode}"] = statistics.median(m[key] for m in runs[mode])
                row[f"tokens_per_s_{mode}_runs"] = [m["tokens_per_s"] for m in runs[mode]]
            row["speedup"] = row["tokens_per_s_on"] / row["tokens_per_s_off"]
            rows.append(row)
            print(f"{batch:>5} {name:<9} {row['tokens_per_s_off']:>9.1f} "
                  f"{row['step_ms_off']:>8.2f} {row['tokens_per_s_on']:>9.1f} "
                  f"{row['step_ms_on']:>8.2f} {row['speedup']:>7.3f} "
                  f"{row['launch_ms_off']:>8.2f} {row['launch_ms_on']:>8.2f} "
                  f"{row['wait_ms_on']:>8.2f}", flush=True)
    return rows


def _generate(engine: LLMEngine, tag: str, prompts, params) -> list[tuple]:
    """(tokens, logprobs as (token, logprob, rank) triples) of each request, in order."""
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"{tag}-{i}", prompt, p)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0]
    results = []
    for i in range(len(prompts)):
        c = finished[f"{tag}-{i}"]
        logprobs = None if c.logprobs is None else [
            sorted((t, lp.logprob, lp.rank) for t, lp in pos.items()) for pos in c.logprobs]
        results.append((c.token_ids, logprobs))
    return results


def identity_checks(engine: LLMEngine, num: int, context: int, steps: int) -> dict:
    rng = random.Random(7)
    vocab = engine.arch.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, context))]
               for _ in range(num)]
    greedy = dict(temperature=0.0)
    params = [_params(greedy if i % 2 else VARIANTS["features"],
                      steps // 2 + (i * steps // 2) // num, i) for i in range(num)]
    engine.async_scheduling = False
    _generate(engine, "warm", prompts, params)  # the prompts' full blocks are cached now
    outputs = {}
    for mode, on in MODES.items():
        engine.async_scheduling = on
        outputs[mode] = _generate(engine, f"id-{mode}", prompts, params)
    mismatched = [i for i, (a, b) in enumerate(zip(outputs["off"], outputs["on"])) if a != b]
    stop_params = [SamplingParams(  # every third request runs to max_tokens
        temperature=0.0, max_tokens=steps, ignore_eos=True,
        stop_token_ids=[tokens[(2 + i % 7) % len(tokens)]] if i % 3 else [])
        for i, (tokens, _) in enumerate(outputs["off"])]
    stops = {}
    for mode, on in MODES.items():
        engine.async_scheduling = on
        stops[mode] = _generate(engine, f"stop-{mode}", prompts, stop_params)
    same_stops = sum(a == b for a, b in zip(stops["off"], stops["on"]))
    return {"requests": num, "mismatched": mismatched, "ok": not mismatched,
            "stop_requests_identical": same_stops,
            "stopped_early": sum(len(t) < steps for t, _ in stops["off"])}


def sync_check(engine: LLMEngine, timers: HostTimes, prompts, warmup: int) -> dict:
    """Synchronizing calls inside launch over a few async decode steps of each variant."""
    if engine.device.type != "cuda":
        return {"checked": False, "syncs": [], "ok": True}
    engine.async_scheduling = True
    for name, variant in VARIANTS.items():
        for i, prompt in enumerate(prompts):
            engine.add_request(f"sync-{name}-{i}", prompt, _params(variant, warmup + 8, i))
        while engine.scheduler.waiting or any(
                not seq.output_token_ids for seq in engine.scheduler.running):
            engine.step()
        engine.step()
        timers.count_syncs = True
        for _ in range(4):
            engine.step()
        timers.count_syncs = False
        _drain(engine)
    return {"checked": True, "syncs": sorted(set(timers.syncs)), "count": len(timers.syncs),
            "ok": not timers.syncs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="default: random:ds-r1-llama-8b on CUDA, "
                    "random:tiny-llama on CPU")
    ap.add_argument("--batches", default=None, help="default 1,32,64,128 (CPU: 1,4)")
    ap.add_argument("--context", type=int, default=None, help="default 512 (CPU: 16)")
    ap.add_argument("--steps", type=int, default=None, help="default 64 (CPU: 6)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (CPU: 1)")
    ap.add_argument("--check-requests", type=int, default=None, help="default 48 (CPU: 6)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    cpu = args.device == "cpu"
    model = args.model or ("random:tiny-llama" if cpu else "random:ds-r1-llama-8b")
    batches = [int(b) for b in (args.batches or ("1,4" if cpu else "1,32,64,128")).split(",")]
    context = args.context or (16 if cpu else 512)
    steps = args.steps or (6 if cpu else 64)
    repeats = args.repeats or (1 if cpu else 3)
    num_check = args.check_requests or (6 if cpu else 48)
    block = 16 if cpu else 64
    max_batch = max(batches + [num_check])
    max_len = context + args.warmup + steps + 16
    per_seq = -(-max_len // block)
    t0 = time.perf_counter()
    engine = LLMEngine.from_options(
        model, device=args.device, block_size=block, max_num_seqs=max_batch,
        num_gpu_blocks=3 * max_batch * per_seq, max_model_len=max_len,
        max_num_batched_tokens=max(8192, max(batches) * context))
    timers = HostTimes(engine)
    print(f"model {engine.model_name}  dtype {engine.dtype}  device {engine.device}  context "
          f"{context}  steps {steps}  warmup {args.warmup}  repeats {repeats}  (engine ready in "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"{'batch':>5} {'variant':<9} {'off tok/s':>9} {'off ms':>8} {'on tok/s':>9} "
          f"{'on ms':>8} {'speedup':>7} {'launch':>8} {'launch':>8} {'wait':>8}")
    print(f"{'':>5} {'':<9} {'':>9} {'/step':>8} {'':>9} {'/step':>8} {'on/off':>7} "
          f"{'off ms':>8} {'on ms':>8} {'on ms':>8}")
    rows = throughput(engine, timers, batches, context, args.warmup, steps, repeats)
    low = min(rows, key=lambda r: r["speedup"])
    high = max(rows, key=lambda r: r["speedup"])
    print(f"async on: {low['speedup']:.3f}x (batch {low['batch']}, {low['variant']}) to "
          f"{high['speedup']:.3f}x (batch {high['batch']}, {high['variant']}) of off")
    check = identity_checks(engine, num_check, context, steps)
    print(f"identity off vs on, {check['requests']} greedy + seeded-features requests (tokens "
          f"and logprobs): {'PASS' if check['ok'] else 'FAIL'}"
          + (f" (mismatched {check['mismatched']})" if check["mismatched"] else ""))
    print(f"stops in the middle of the batch ({check['stopped_early']} of {check['requests']} "
          f"stop early): {check['stop_requests_identical']}/{check['requests']} requests "
          "identical (informational)")
    syncs = sync_check(engine, timers, _prompts(min(max_batch, 8), context,
                                                engine.arch.vocab_size, seed=3), args.warmup)
    if syncs["checked"]:
        print(f"synchronizing calls inside launch: {syncs['count']} "
              f"{'PASS' if syncs['ok'] else 'FAIL'}" + "".join(f"\n  {s}" for s in syncs["syncs"]))
    else:
        print("synchronizing calls inside launch: not checked (CUDA only)")
    engine.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": engine.model_name, "dtype": str(engine.dtype),
                       "device": str(engine.device), "context": context, "steps": steps,
                       "warmup": args.warmup, "repeats": repeats, "rows": rows,
                       "identity": check, "syncs": syncs}, f, indent=2)
    return 0 if check["ok"] and syncs["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
