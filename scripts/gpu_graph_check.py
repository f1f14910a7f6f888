"""CUDA graphs of decode steps on a GPU: graph vs eager greedy parity, and decode step times.

    python3 scripts/gpu_graph_check.py parity --json OUT/graph_parity.json
    python3 scripts/gpu_graph_check.py decode --batch-sizes 1,32,128 --context 4096 \
        --json OUT/graph_decode_8b.json

parity: the same prompts through an eager engine (enforce_eager=True) and a graph engine, per
case (tiny presets in fp32/bf16, the 8B preset in bf16); prompts of mixed lengths and staggered
max_tokens so decode batches shrink across the captured sizes (padding) and, with max_num_seqs
below the number of prompts, admissions mix prefill into decode steps (eager). Reports identical
requests and the first divergence of any other.

decode: for each mode (eager, graph) one engine; for each batch size B, B requests with
--context random prompt tokens are prefilled (in chunks of --max-num-batched-tokens), then, with
all B decoding, --warmup steps and --steps timed ``LLMEngine.step()`` calls (scheduling, input
building, model, sampling; measured by hifc.bench.kernels, as in ``hifc bench kernels``). Prints
step ms, tokens/s, graph speed-up, and the step time over the memory floor (the weights its
matmuls read, lm_head included, plus the KV, at the device-to-device copy rate measured here).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hifc import LLM, LLMEngine, SamplingParams  # noqa: E402
from hifc.bench import costs, kernels, probes  # noqa: E402


def _prompts(n: int, lengths: tuple[int, int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


PARITY_CASES = [
    # name, model, dtype, prompts, prompt lengths, max_tokens, max_num_seqs, engine options
    ("tiny-llama fp32", "random:tiny-llama", "float32", 37, (1, 600), 32, 40,
     dict(block_size=16, num_gpu_blocks=2048)),
    ("tiny-llama bf16", "random:tiny-llama", "bfloat16", 37, (1, 600), 32, 40,
     dict(block_size=16, num_gpu_blocks=2048)),
    ("tiny-qwen2 bf16, admissions", "random:tiny-qwen2", "bfloat16", 37, (1, 600), 32, 12,
     dict(block_size=64, num_gpu_blocks=512)),
    ("8b bf16", "random:ds-r1-llama-8b", "bfloat16", 24, (100, 3000), 48, 32,
     dict(block_size=64, kv_cache_gib=24, max_model_len=4096)),
    ("8b bf16, admissions", "random:ds-r1-llama-8b", "bfloat16", 24, (100, 3000), 48, 10,
     dict(block_size=64, kv_cache_gib=24, max_model_len=4096)),
]


def parity_case(name, model, dtype, num_prompts, lengths, max_tokens, max_num_seqs,
                options) -> dict:
    outputs, info = {}, {}
    prompts = None
    for mode in ("eager", "graph"):
        llm = LLM(model, device="cuda", dtype=dtype, max_num_seqs=max_num_seqs,
                  enforce_eager=mode == "eager", **options)
        if prompts is None:
            prompts = _prompts(num_prompts, lengths, llm.engine.arch.vocab_size, seed=len(name))
        params = [SamplingParams(max_tokens=max_tokens - (i % 8) * (max_tokens // 10),
                                 temperature=0.0, ignore_eos=True) for i in range(num_prompts)]
        probes.sync("cuda")
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        probes.sync("cuda")
        info[mode] = {"seconds": time.perf_counter() - t0,
                      "steps": llm.stats()["steps"],
                      "graph_decode_steps": llm.stats()["graph_decode_steps"],
                      **probes.graph_capture_info(llm.engine)}
        outputs[mode] = [o.token_ids for o in outs]
        del llm, outs
        probes.free_device_memory("cuda")
    diverged = {i: _first_divergence(e, g)
                for i, (e, g) in enumerate(zip(outputs["eager"], outputs["graph"])) if e != g}
    return {"case": name, "model": model, "dtype": dtype, "requests": num_prompts,
            "tokens": sum(map(len, outputs["eager"])),
            "identical_requests": num_prompts - len(diverged),
            "first_divergence": diverged, **{f"{m}_{k}": v for m in info for k, v in
                                             info[m].items()}}


def run_parity(args) -> list[dict]:
    rows = []
    for case in PARITY_CASES:
        if args.cases and not any(c in case[0] for c in args.cases.split(",")):
            continue
        row = parity_case(*case)
        rows.append(row)
        print(f"{row['case']:<28} requests {row['requests']:>3}  identical "
              f"{row['identical_requests']:>3}  tokens {row['tokens']:>5}  graph steps "
              f"{row['graph_graph_decode_steps']}/{row['graph_steps']}  eager "
              f"{row['eager_seconds']:.2f} s  graph {row['graph_seconds']:.2f} s  capture "
              f"{row['graph_capture_seconds']:.1f} s {row['graph_capture_mib']:.0f} MiB"
              + (f"  DIVERGED (request: first index) {row['first_divergence']}"
                 if row["first_divergence"] else ""), flush=True)
    return rows


def decode_mode(args, enforce_eager: bool,
                batches: list[int]) -> tuple[list[dict], dict, dict[int, list[list[int]]]]:
    """One engine (eager or with decode graphs); hifc.bench.kernels measures each batch."""
    options = kernels.sized_options(
        dict(model=args.model, device="cuda", dtype="bfloat16", block_size=args.block_size,
             max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=enforce_eager),
        batches, args.context, args.steps, args.warmup)
    engine = LLMEngine.from_options(**options)
    max_tokens = kernels.decode_max_tokens(batches, args.context, args.steps, args.warmup,
                                           options["max_num_batched_tokens"])
    rows, tokens = [], {}
    for batch in batches:
        row, tokens[batch] = kernels.measure_decode(engine, batch, args.context, args.steps,
                                                    args.warmup, max_tokens)
        rows.append(row)
    meta = {**probes.graph_capture_info(engine),
            "weight_bytes_read": costs.weight_bytes_read(engine)}
    del engine
    probes.free_device_memory("cuda")
    return rows, meta, tokens


def run_decode(args) -> dict:
    batches = [int(b) for b in args.batch_sizes.split(",")]
    rate = probes.copy_gbps("cuda")
    result = {"model": args.model, "copy_gbps": rate, "modes": {}}
    tokens = {}
    for mode in ("eager", "graph"):
        rows, meta, tokens[mode] = decode_mode(args, mode == "eager", batches)
        result["modes"][mode] = {"rows": rows, **meta}
    eager, graph = (result["modes"][m] for m in ("eager", "graph"))
    print(f"model {args.model} bf16, block {args.block_size}, context {args.context}, "
          f"copy {rate:.0f} GB/s (read+write); graph capture {graph['capture_seconds']:.1f} s, "
          f"{graph['capture_mib']:.0f} MiB, sizes {graph['captured_sizes']}")
    print(f"{'batch':>5} {'eager ms':>9} {'graph ms':>9} {'speed-up':>8} {'eager tok/s':>11} "
          f"{'graph tok/s':>11} {'floor ms':>8} {'graph/floor':>11} {'same tokens':>11}")
    for e, g in zip(eager["rows"], graph["rows"]):
        floor_ms = kernels.add_floor(g, rate)["floor_ms"]  # reads at the copy's read+write rate
        same = tokens["eager"][e["batch"]] == tokens["graph"][g["batch"]]
        g["same_tokens_as_eager"] = same
        print(f"{e['batch']:>5} {e['step_ms']:>9.2f} {g['step_ms']:>9.2f} "
              f"{e['step_ms'] / g['step_ms']:>8.2f} {e['tokens_per_s']:>11.1f} "
              f"{g['tokens_per_s']:>11.1f} {floor_ms:>8.2f} {g['step_ms'] / floor_ms:>11.2f} "
              f"{str(same):>11}")
        if g["graph_steps"] != 2 * g["steps"]:
            print(f"  note: only {g['graph_steps']} of {2 * g['steps']} graph-mode steps replayed "
                  "a graph")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parity")
    p.add_argument("--cases", help="comma-separated substrings of case names (default: all)")
    p.add_argument("--json")
    d = sub.add_parser("decode")
    d.add_argument("--model", default="random:ds-r1-llama-8b")
    d.add_argument("--batch-sizes", default="1,32,128")
    d.add_argument("--context", type=int, default=4096)
    d.add_argument("--steps", type=int, default=32)
    d.add_argument("--warmup", type=int, default=3)
    d.add_argument("--block-size", type=int, default=64)
    d.add_argument("--max-num-batched-tokens", type=int, default=65536)
    d.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    result = run_parity(args) if args.cmd == "parity" else run_decode(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    if args.cmd == "parity":
        return 0 if all(not r["first_divergence"] for r in result) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
