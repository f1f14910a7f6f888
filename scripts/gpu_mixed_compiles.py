"""Which Triton kernels compile in the middle of a run: waves of requests on one engine, each
wave's steps mixing decodes with prompt chunks, after one untimed wave of warm-up.

    PYTHONPATH=$PWD python3 scripts/gpu_mixed_compiles.py --tokens-json OUT/tokens.json
    PYTHONPATH=$PWD python3 scripts/gpu_mixed_compiles.py --device cpu   # smoke run, tiny

The engine (random:ds-r1-llama-8b, bf16, decode CUDA graphs) first runs a wave of random prompt
lengths (its compiles and the start-up's are listed: after start-up's warm-up steps it should
compile nothing). Then each wave of equal-length prompts runs twice: the fused prefill kernels
serve a chunk shape once it recurs, so the second run's steps attend their leading decodes
apart from the chunks (a launch of their own, planned for their count). Each wave prints its
steps, wall time, and every kernel compiled in it (Triton's JIT hooks: name, seconds,
specialisation).
Run it with TRITON_CACHE_DIR set to an empty directory, or a compile may be a quick load from
Triton's disk cache. ``--tokens-json`` writes every request's greedy tokens, to compare two
versions of the code.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hifc import LLMEngine, SamplingParams  # noqa: E402
from hifc.layers.triton_jit import kernel_compiles  # noqa: E402

# (prompt length, requests), each run twice
WAVES = [(1024, 24), (1500, 30), (600, 40), (700, 33), (1100, 45), (2000, 20), (5000, 12)]
SMOKE_WAVES = [(100, 5), (60, 4)]
# the warm-up wave's prompt lengths: 70% in the first range, 10% in the second, 20% in the third
MIXED_LENGTHS = ((520, 1900), (4200, 6000), (2, 400))
SMOKE_MIXED_LENGTHS = ((60, 250), (500, 700), (2, 50))


def run_wave(engine, seed: int, n: int, tag: str, length: int | None,
             mixed: tuple) -> tuple[dict[str, list[int]], int]:
    """n requests of ``length`` prompt tokens (None: of the ``mixed`` ranges), 16 greedy tokens
    each (4-24 for mixed lengths), run to the end -> (request id -> tokens, steps)."""
    rng = random.Random(seed)
    vocab = engine.arch.vocab_size
    for i in range(n):
        r = rng.random()
        size = length or rng.randint(*mixed[0 if r < 0.7 else 1 if r < 0.8 else 2])
        engine.add_request(f"{tag}-{i}", [rng.randrange(vocab) for _ in range(size)],
                           SamplingParams(max_tokens=16 if length else rng.randint(4, 24),
                                          temperature=0.0, ignore_eos=True))
    tokens, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
    return tokens, steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens-json", help="write every request's greedy tokens here")
    args = p.parse_args()
    smoke = args.device == "cpu"
    options = (dict(model="random:tiny-llama", dtype="float32", max_model_len=1024,
                    kv_cache_gib=0.2) if smoke else
               dict(model="random:ds-r1-llama-8b", dtype="bfloat16", max_model_len=8192,
                    kv_cache_gib=40, max_num_seqs=128))
    mixed = SMOKE_MIXED_LENGTHS if smoke else MIXED_LENGTHS
    started = time.perf_counter()
    engine = LLMEngine.from_options(options.pop("model"), device=args.device, **options)
    at_start = kernel_compiles()
    print(f"engine start-up: {time.perf_counter() - started:.1f} s, {len(at_start)} compiles "
          "(most of them side by side)")
    started = time.perf_counter()
    run_wave(engine, 0, 6, "warm", None, mixed)
    new = kernel_compiles()[len(at_start):]
    print(f"warm-up wave {time.perf_counter() - started:.1f} s, compiles {len(new)}: "
          f"{sum(c.seconds for c in new):.1f} s")
    for c in new:
        print(f"   {c.seconds:.2f} s {c.kernel[:60]}")
    tokens: dict[str, list[int]] = {}
    waves = [w for w in (SMOKE_WAVES if smoke else WAVES) for _ in (0, 1)]
    for seed, (length, n) in enumerate(waves, 1):
        before = len(kernel_compiles())
        started = time.perf_counter()
        outs, steps = run_wave(engine, seed, n, f"w{seed}", length, mixed)
        tokens.update(outs)
        new = kernel_compiles()[before:]
        print(f"wave {seed}: {len(outs)} requests of {length} tokens, {steps} steps, "
              f"{time.perf_counter() - started:.2f} s, compiles {len(new)}: "
              f"{sum(c.seconds for c in new):.1f} s")
        for c in new:
            print(f"   {c.seconds:.2f} s {c.kernel[:60]}\n      {c.specialization[:3000]}")
    if args.tokens_json:
        Path(args.tokens_json).write_text(json.dumps(tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
