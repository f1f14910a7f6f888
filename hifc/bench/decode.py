"""``hifc bench decode``: decode throughput of the engine at several batch sizes.

Each batch size runs B requests with prompts of ``--context`` random token ids: their prefill
(in steps of up to 65,536 tokens unless ``--max-num-batched-tokens`` says otherwise), one untimed
decode step, then ``--steps`` timed decode steps through ``LLMEngine.step()`` (scheduling,
input building, model, sampling: everything a served token costs).
"""
from __future__ import annotations

import argparse
import json
import random
import time

from hifc.bench.kernels import DEFAULT_BATCHED_TOKENS, kv_blocks
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


def new_tokens(batch: int, context: int, steps: int, budget: int) -> int:
    """Tokens each request asks for: the first prompts decode while later ones are still being
    prefilled (chunked prefill, ``budget`` tokens a step), so enough that every sequence still
    runs through the warm-up and timed steps."""
    prefill_steps = -(-batch * context // max(1, budget - batch)) + 1
    return steps + 3 + prefill_steps


def measure(engine, batch: int, context: int, steps: int, seed: int = 0) -> dict:
    from hifc.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = engine.arch.vocab_size
    params = SamplingParams(max_tokens=new_tokens(batch, context, steps,
                                                  engine.limits.max_num_batched_tokens),
                            temperature=0.0, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, [rng.randrange(vocab) for _ in range(context)], params)
    first = set()
    while len(first) < batch:  # prefill, in as many steps as the step budget takes
        first.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    engine.step()  # first decode: warm-up
    sync(engine.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(engine.device)
    elapsed = time.perf_counter() - t0
    engine.abort_request(ids)
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
    batch = max(batches)
    budget = config.max_num_batched_tokens or max(
        8192, args.context, min(batch * args.context, DEFAULT_BATCHED_TOKENS))
    options = dict(config.options(), max_num_seqs=max(config.max_num_seqs, batch),
                   max_num_batched_tokens=budget)
    if not config.kv_pool_given:
        tokens = args.context + new_tokens(batch, args.context, args.steps, budget)
        options["num_gpu_blocks"] = kv_blocks(batch, tokens, config.block_size)
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
