"""Decode throughput with vLLM's sampling features on, against plain sampling, in one run.

    PYTHONPATH=$PWD python3 scripts/gpu_sampling_bench.py [--json OUT.json]
    PYTHONPATH=$PWD python3 scripts/gpu_sampling_bench.py --device cpu   # smoke: tiny preset

One engine (default: random:ds-r1-llama-8b, bf16, CUDA graphs of the decode steps). For each
variant, --batch requests of --context random prompt tokens are prefilled, then one warm-up
decode step and --steps timed ``LLMEngine.step()`` calls run with every request decoding
(scheduling, inputs, the graph replay, the sampler, outputs and detokenization-free bookkeeping:
everything a served token costs). Variants, timed in turn over --repeats rounds (ABC, ABC, ...)
so that drift hits all alike; the median of each is reported:

- plain: temperature 1.0, nothing else;
- features: temperature 1.0 with logprobs=5, presence 0.5, frequency 0.5, repetition 1.1
  penalties and min_p 0.05;
- features, seeded: the same with a seed per request (the hashed per-request noise).

PASS when the features variant keeps >= 0.90x the plain tokens/s. Then a correctness check on
the device: a greedy batch with logprobs=5, where each step's returned logprobs, ranks and top-5
are compared with log_softmax of the very logits the sampler received, and the greedy tokens
with their argmax.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hifc import LLMEngine, SamplingParams  # noqa: E402
from hifc.bench.probes import sync  # noqa: E402
from hifc.layers.sampler import Sampler  # noqa: E402

FEATURES = dict(logprobs=5, presence_penalty=0.5, frequency_penalty=0.5,
                repetition_penalty=1.1, min_p=0.05)
VARIANTS = {
    "plain": dict(temperature=1.0),
    "features": dict(temperature=1.0, **FEATURES),
    "features, seeded": dict(temperature=1.0, seed=1234, **FEATURES),
}
MIN_RATIO = 0.90


def _prompts(batch: int, context: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(context)] for _ in range(batch)]


def decode_tokens_per_s(engine: LLMEngine, name: str, params: dict, prompts: list[list[int]],
                        steps: int, round_index: int) -> tuple[float, int]:
    """Tokens/s of ``steps`` decode steps with every request decoding; and how many of them
    replayed a CUDA graph."""
    p = SamplingParams(max_tokens=steps + 2, ignore_eos=True, **params)
    for i, prompt in enumerate(prompts):
        seeded = p if p.seed is None else SamplingParams(
            max_tokens=steps + 2, ignore_eos=True, **{**params, "seed": params["seed"] + i})
        engine.add_request(f"{name}-{round_index}-{i}", prompt, seeded)
    while engine.scheduler.waiting or any(  # prefill (in chunks, if it must)
            not seq.output_token_ids for seq in engine.scheduler.running):
        engine.step()
    engine.step()  # first decode step: warm-up
    graph_steps = engine.runner.num_graph_decode_steps
    sync(engine.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(engine.device)
    elapsed = time.perf_counter() - t0
    graph_steps = engine.runner.num_graph_decode_steps - graph_steps
    while engine.has_unfinished_requests():
        engine.step()
    return len(prompts) * steps / elapsed, graph_steps


class _CheckingSampler(Sampler):
    """The engine's sampler, checking each step's logprobs against the logits it was given."""

    def __init__(self):
        self.steps = 0
        self.rows = 0
        self.max_logprob_error = 0.0
        self.mismatches = 0

    def sample(self, logits, batch, generator):
        reference = torch.log_softmax(logits.float(), dim=-1)  # before the in-place edits
        out = super().sample(logits, batch, generator)
        if out.logprobs is None:
            return out
        tokens = out.token_ids
        expected = reference.gather(1, tokens[:, None]).squeeze(1)
        ranks = (reference > expected[:, None]).sum(-1) + 1
        top = reference.topk(out.top_logprobs.shape[1], dim=-1)
        errors = torch.stack([(out.logprobs - expected).abs().max(),
                              (out.top_logprobs - top.values).abs().max()])
        self.max_logprob_error = max(self.max_logprob_error, errors.max().item())
        self.mismatches += int((tokens != reference.argmax(-1)).sum()) \
            + int((out.ranks != ranks).sum())
        self.steps += 1
        self.rows += tokens.shape[0]
        return out


def logprob_check(engine: LLMEngine, prompts: list[list[int]], steps: int) -> dict:
    checker = _CheckingSampler()
    engine.runner.sampler = checker
    try:
        params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True, logprobs=5)
        for i, prompt in enumerate(prompts):
            engine.add_request(f"check-{i}", prompt, params)
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id] = out
    finally:
        engine.runner.sampler = Sampler()
    consistent = all(o.outputs[0].logprobs[j][t].rank == 1 for o in outputs.values()
                     for j, t in enumerate(o.token_ids))
    return {"steps": checker.steps, "rows": checker.rows,
            "max_logprob_error": checker.max_logprob_error, "mismatches": checker.mismatches,
            "greedy_tokens_rank_1": consistent,
            "ok": checker.mismatches == 0 and consistent and checker.max_logprob_error < 1e-5}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="default: random:ds-r1-llama-8b on CUDA, "
                    "random:tiny-llama on CPU")
    ap.add_argument("--batch", type=int, default=None, help="default 64 (CPU: 4)")
    ap.add_argument("--context", type=int, default=None, help="default 512 (CPU: 16)")
    ap.add_argument("--steps", type=int, default=None, help="default 64 (CPU: 6)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    cpu = args.device == "cpu"
    model = args.model or ("random:tiny-llama" if cpu else "random:ds-r1-llama-8b")
    batch = args.batch or (4 if cpu else 64)
    context = args.context or (16 if cpu else 512)
    steps = args.steps or (6 if cpu else 64)
    block = 16 if cpu else 64
    need = batch * (-(-(context + steps + 4) // block))
    t0 = time.perf_counter()
    engine = LLMEngine.from_options(
        model, device=args.device, block_size=block, max_num_seqs=batch,
        num_gpu_blocks=need + batch, max_model_len=context + steps + 16,
        max_num_batched_tokens=max(8192, batch * context))
    print(f"model {engine.model_name}  dtype {engine.dtype}  device {engine.device}  batch "
          f"{batch}  context {context}  steps {steps}  (engine ready in "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)
    prompts = _prompts(batch, context, engine.arch.vocab_size, seed=0)
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    graphs: dict[str, int] = {}
    for r in range(args.repeats):
        for name, params in VARIANTS.items():
            rate, graph_steps = decode_tokens_per_s(engine, name, params, prompts, steps, r)
            rates[name].append(rate)
            graphs[name] = graph_steps
    plain = statistics.median(rates["plain"])
    rows = []
    print(f"{'variant':<18} {'tokens/s':>10} {'step ms':>9} {'x plain':>8} {'graph steps':>12}")
    for name, values in rates.items():
        tps = statistics.median(values)
        rows.append({"variant": name, "params": VARIANTS[name], "tokens_per_s": tps,
                     "tokens_per_s_runs": values, "ratio": tps / plain,
                     "graph_decode_steps": graphs[name]})
        print(f"{name:<18} {tps:>10.1f} {1000 * batch / tps:>9.2f} {tps / plain:>8.3f} "
              f"{graphs[name]:>7}/{steps}")
    ratio = statistics.median(rates["features"]) / plain
    throughput_ok = ratio >= MIN_RATIO
    print(f"features at {ratio:.3f}x of plain sampling: "
          f"{'PASS' if throughput_ok else 'FAIL'} (>= {MIN_RATIO})")
    check = logprob_check(engine, prompts[:min(batch, 16)], min(steps, 16))
    print(f"logprob check on {check['rows']} rows in {check['steps']} steps: max |error| "
          f"{check['max_logprob_error']:.2e}, argmax/rank mismatches {check['mismatches']}: "
          f"{'PASS' if check['ok'] else 'FAIL'}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": engine.model_name, "dtype": str(engine.dtype),
                       "device": str(engine.device), "batch": batch, "context": context,
                       "steps": steps, "repeats": args.repeats, "variants": rows,
                       "ratio": ratio, "logprob_check": check}, f, indent=2)
    return 0 if throughput_ok and check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
