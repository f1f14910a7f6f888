"""Structured outputs on the GPU: JSON-schema requests against free ones, with and without
asynchronous scheduling, on SmolLM2-135M-Instruct (a real tokenizer: 49,152 tokens to mask).

    PYTHONPATH=$PWD python3 scripts/gpu_structured_bench.py [--json OUT] [--requests 64]
    PYTHONPATH=$PWD python3 scripts/gpu_structured_bench.py --device cpu --requests 4  # smoke

One engine per scheduling mode (bf16, CUDA graphs). Each asks, --repeats times in turn, for the
same --requests chat prompts (an animal to describe):
- json: greedy, constrained by a JSON schema (no free whitespace), at most --max-tokens;
- free: greedy, unconstrained, --max-tokens each (EOS ignored).
Reports output tokens/s (the median run), the engine's steps and the steps it overlapped with
applying the step before, and a digest of the texts, which must be the same in both modes.
Runs of another checkout compare through PYTHONPATH (the script imports hifc from there).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

import torch

from hifc import LLM, SamplingParams
from hifc.sampling_params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "colour": {"type": "string", "maxLength": 16},
    "legs": {"type": "integer", "minimum": 0, "maximum": 100},
    "habitat": {"type": "string", "maxLength": 40}},
    "required": ["name", "colour", "legs", "habitat"], "additionalProperties": False}
ANIMALS = ["cat", "dog", "heron", "octopus", "spider", "horse", "snail", "owl"]
COLOURS = ["red", "green", "blue", "black", "white", "golden", "grey", "spotted"]


def conversations(n: int) -> list[list[dict]]:
    pairs = [(c, a) for c in COLOURS for a in ANIMALS]
    return [[{"role": "user", "content": f"Describe a {c} {a} as a JSON object with its name, "
                                         f"colour, number of legs and habitat."}]
            for c, a in (pairs[i % len(pairs)] for i in range(n))]


def params(kind: str, max_tokens: int) -> SamplingParams:
    if kind == "json":
        return SamplingParams(temperature=0, max_tokens=max_tokens,
                              structured_outputs=StructuredOutputsParams(
                                  json=json.dumps(SCHEMA), disable_any_whitespace=True))
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def timed(llm: LLM, convs: list, p: SamplingParams) -> dict:
    before = llm.stats()
    if llm.engine.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.chat(convs, p, use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = llm.stats()
    texts = [o.outputs[0].text for o in outs]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "steps": after["steps"] - before["steps"],
            "overlapped_steps": after["overlapped_steps"] - before["overlapped_steps"],
            "digest": hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:12],
            "valid_json": sum(_is_json(t) for t in texts), "first_text": texts[0]}


def _is_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-cache-gib", type=float, default=4.0, help="each engine's KV cache")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    convs = conversations(args.requests)
    results = []
    for async_scheduling in (True, False):
        llm = LLM(args.model, device=args.device,
                  dtype="bfloat16" if args.device == "cuda" else "float32",
                  max_num_seqs=max(args.requests, 8), async_scheduling=async_scheduling,
                  kv_cache_gib=args.kv_cache_gib)
        for kind in ("json", "free"):  # warm-up: grammar compile, every batch size's path
            llm.chat(convs, params(kind, args.max_tokens), use_tqdm=False)
        runs: dict[str, list[dict]] = {"json": [], "free": []}
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(timed(llm, convs, params(kind, args.max_tokens)))
        for kind, rs in runs.items():
            median = statistics.median(r["tokens_per_s"] for r in rs)
            row = {"async_scheduling": async_scheduling, "kind": kind, "median_tokens_per_s":
                   median, "runs": rs}
            results.append(row)
            r = rs[0]
            each = ", ".join(f"{x['tokens_per_s']:.1f}" for x in rs)
            print(f"async {str(async_scheduling):5} {kind:4}  {median:9.1f} tok/s  "
                  f"({each})  tokens {r['tokens']}  "
                  f"steps {r['steps']}  overlapped {r['overlapped_steps']}  digest {r['digest']}  "
                  f"valid json {r['valid_json']}/{args.requests}", flush=True)
        llm.close()
    print("first json text:", results[0]["runs"][0]["first_text"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"requests": args.requests, "max_tokens": args.max_tokens,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
