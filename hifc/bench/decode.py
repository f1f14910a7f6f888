"""``hifc bench decode``: decode throughput of the engine at several batch sizes.

Each batch size runs B requests with prompts of ``--context`` random token ids: one prefill step,
then ``--steps`` timed decode steps through ``LLMEngine.step()`` (scheduling, input building,
model, sampling: everything a served token costs).
"""
from __future__ import annotations

import argparse
import json
import random
import time

from hifc.bench.probes import sync
from hifc.config import add_engine_args, engine_config_from_args, named_with_overrides


def register(subparsers) -> None:
    p = subparsers.add_parser("decode", help="decode throughput at several batch sizes")
    p.add_argument("--batch-sizes", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--context", type=int, default=1024, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per batch size")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    add_engine_args(p, model="random:ds-r1-llama-8b")
    p.set_defaults(func=run)


def measure(engine, batch: int, context: int, steps: int, seed: int = 0) -> dict:
    from hifc.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = engine.arch.vocab_size
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [rng.randrange(vocab) for _ in range(context)], params)
    while engine.scheduler.waiting:  # prefill (one or more steps)
        engine.step()
    engine.step()  # first decode: warm-up
    sync(engine.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(engine.device)
    elapsed = time.perf_counter() - t0
    while engine.has_unfinished_requests():
        engine.step()
    return {"batch": batch, "context": context, "steps": steps,
            "step_ms": 1000 * elapsed / steps, "tokens_per_s": batch * steps / elapsed}


def run(args: argparse.Namespace) -> int:
    from hifc.engine.llm_engine import LLMEngine

    batches = [int(b) for b in args.batch_sizes.split(",")]
    if min(batches) < 1 or args.context < 1 or args.steps < 1:
        raise ValueError("batch sizes, --context and --steps must be positive")
    config = engine_config_from_args(args)
    need = max(batches) * (args.context + args.steps + 3)
    options = dict(config.options(), max_num_seqs=max(config.max_num_seqs, max(batches)),
                   max_num_batched_tokens=config.max_num_batched_tokens or
                   max(8192, max(batches) * args.context))
    if not config.kv_pool_given:
        options["num_gpu_blocks"] = -(-need // config.block_size)
    engine = LLMEngine.from_options(**options)
    rows = [measure(engine, b, args.context, args.steps, config.seed) for b in batches]
    print(f"model {named_with_overrides(engine.model_name, config.hf_overrides)}  "
          f"dtype {engine.dtype}  device {engine.device}  "
          f"block {config.block_size}  context {args.context}")
    print(f"{'batch':>6} {'step ms':>9} {'tokens/s':>10}")
    for r in rows:
        print(f"{r['batch']:>6} {r['step_ms']:>9.2f} {r['tokens_per_s']:>10.1f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": engine.model_name, "hf_overrides": config.hf_overrides,
                       "dtype": str(engine.dtype),
                       "device": str(engine.device), "results": rows}, f, indent=2)
    return 0
