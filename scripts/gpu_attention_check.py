"""Check and time the Triton paged attention on a CUDA GPU, in one run.

1. Runs tests/layers/test_triton_attention.py (correctness against the torch reference).
2. Measures a device-to-device copy (the memory-bandwidth ceiling for this run).
3. Times (triton.testing.do_bench, median, L2 flushed before each call) on the Llama-3-8B shape
   (32 query heads, 8 KV heads, head_dim 128, bf16, block size 64):
   - decode at batch 1 / 32 / 128 with 4k contexts, for the chosen launch plan and a few
     alternatives (with and without split-KV), as KV bytes read per step over time (GB/s);
   - a causal prefill of 8k tokens, as TFLOP/s, next to torch's scaled_dot_product_attention;
   - the KV write (Triton fused kernel vs two torch index_copy_).
   Every timed variant is first checked against the fp32 reference.

Usage: PYTHONUNBUFFERED=1 PYTHONPATH=. python3 scripts/gpu_attention_check.py [--skip-tests]
Writes the tables and raw numbers to $OUT/attention_check.json when OUT is set.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing

from hifc.layers.attention import AttentionMetadata, reference_paged_attention, write_kv_cache
from hifc.layers.triton_attention import LaunchPlan, TritonAttentionBackend, paged_attention
from hifc.layers.triton_kv_write import triton_write_kv_cache

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, DTYPE = 32, 8, 128, 64, torch.bfloat16
DEVICE = "cuda"


def run_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "tests/layers/test_triton_attention.py", "-q", "-rfs",
           "-p", "no:cacheprovider", "--tb=line"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "8"]
    errlog = os.path.abspath("attention_test_errors.txt")
    if os.path.exists(errlog):
        os.remove(errlog)
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "HIFC_ATTN_ERRLOG": errlog})
    print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n")
    errors = {}
    if os.path.exists(errlog):
        with open(errlog) as f:
            for line in f:
                name, err = line.split()
                errors[name.split("::")[-1]] = float(err)
        os.remove(errlog)
    print("relative error per test case (vs fp32 reference):")
    for name in sorted(errors):
        print(f"  {name:60s} {errors[name]:.2e}")
    return {"cmd": " ".join(cmd), "returncode": proc.returncode,
            "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "",
            "seconds": round(time.time() - start, 1), "errors": errors}


def make_step(batch: int, context_len: int, query_len: int, seed: int):
    """batch sequences, each with query_len new tokens after context_len cached ones."""
    torch.manual_seed(seed)
    seq_len = context_len + query_len
    blocks_per_seq = -(-seq_len // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    block_tables = torch.randperm(num_blocks, device=DEVICE).to(torch.int32).view(batch, -1)
    kv_cache = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=DEVICE,
                           dtype=DTYPE)
    pos = torch.arange(context_len, seq_len, device=DEVICE)  # [n]
    slots = block_tables[:, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE  # [B, n]
    num_tokens = batch * query_len
    qsl = [i * query_len for i in range(batch + 1)]
    meta = AttentionMetadata(
        slot_mapping=slots.reshape(-1),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.full((batch,), seq_len, dtype=torch.int32, device=DEVICE),
        block_tables=block_tables, query_start_loc_cpu=qsl, seq_lens_cpu=[seq_len] * batch,
        max_query_len=query_len, max_seq_len=seq_len, block_size=BLOCK_SIZE)
    q = torch.randn(num_tokens, NUM_Q_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    write_kv_cache(k, v, kv_cache, meta.slot_mapping)
    return q, k, v, kv_cache, meta


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_ms(fn) -> float:
    """fn captured in a CUDA graph and replayed: the kernels' time without Python launch gaps."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench_ms(graph.replay)


def copy_bandwidth_gbs() -> float:
    src = torch.randn(1 << 29, device=DEVICE, dtype=DTYPE)  # 1 GiB
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def time_variants(name, step, plans, extra_cols, use_graph=False):
    """Check each plan against the fp32 reference, then time it (eager, and replayed from a CUDA
    graph if use_graph; extra_cols gets the graph time when there is one). Returns result rows."""
    q, _, _, kv_cache, meta = step
    scale = 1.0 / math.sqrt(HEAD_DIM)
    ref = reference_paged_attention(q.float(), kv_cache.float(), meta, scale)
    rows = []
    for label, plan in plans:
        out = torch.full_like(q, float("nan"))
        paged_attention(q, kv_cache, meta, scale, plan, out)
        err = rel_err(out, ref)
        bad = bool(torch.isnan(out).any()) or err > 1e-2
        call = lambda: paged_attention(q, kv_cache, meta, scale, plan, out)  # noqa: E731
        ms = bench_ms(call)
        g_ms = graph_ms(call) if use_graph else None
        row = {"case": name, "variant": label, "plan": dataclasses.asdict(plan), "ms": ms,
               "graph_ms": g_ms, "rel_err": err, "ok": not bad}
        row.update(extra_cols(g_ms or ms))
        rows.append(row)
        print(f"  {name:18s} {label:26s} {ms * 1e3:9.1f} us  graph "
              f"{(g_ms or 0) * 1e3:7.1f} us  err {err:.1e}"
              f"{'  FAILED' if bad else ''}", flush=True)
    return rows


def decode_rows(batch: int, copy_gbs: float) -> list[dict]:
    context = 4095  # 4096 keys including the new token
    step = make_step(batch, context, 1, seed=batch)
    q, _, _, kv_cache, meta = step
    kv_bytes = 2 * batch * (context + 1) * NUM_KV_HEADS * HEAD_DIM * kv_cache.element_size()
    chosen = TritonAttentionBackend().plan(q, kv_cache, meta)
    base = dataclasses.replace(chosen, num_segments=1)
    plans = [("auto " + (f"split{chosen.num_segments}" if chosen.num_segments > 1 else "2d")
              + f" t{chosen.tile} w{chosen.num_warps} s{chosen.num_stages}", chosen)]
    for tile, warps, stages in [(64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 2)]:
        plans.append((f"2d t{tile} w{warps} s{stages}",
                      dataclasses.replace(base, tile=tile, num_warps=warps, num_stages=stages)))
    for segments in (2, 4, 8, 16, 32):
        plans.append((f"split{segments} t{base.tile} w{base.num_warps} s{base.num_stages}",
                      dataclasses.replace(base, num_segments=segments)))

    def cols(ms):
        gbs = kv_bytes / ms / 1e6
        return {"kv_gb": kv_bytes / 1e9, "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs}
    return time_variants(f"decode B={batch} 4k", step, plans, cols, use_graph=True)


def prefill_rows(num_tokens: int) -> list[dict]:
    step = make_step(1, 0, num_tokens, seed=7)
    q, _, _, kv_cache, meta = step
    flops = 4 * NUM_Q_HEADS * HEAD_DIM * num_tokens * (num_tokens + 1) / 2  # causal QK^T + PV
    chosen = TritonAttentionBackend().plan(q, kv_cache, meta)
    plans = [(f"auto m{chosen.block_m} t{chosen.tile} w{chosen.num_warps} s{chosen.num_stages}",
              chosen)]
    for block_m, tile, warps, stages in [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                         (64, 128, 4, 2)]:
        plans.append((f"m{block_m} t{tile} w{warps} s{stages}",
                      LaunchPlan(block_m, block_m // (NUM_Q_HEADS // NUM_KV_HEADS), tile, 1,
                                 warps, stages)))
    rows = time_variants(f"prefill {num_tokens}", step, plans,
                         lambda ms: {"tflops": flops / ms / 1e9})
    # Baseline: torch SDPA (flash) on contiguous q/k/v, no paging.
    qt = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, S, D]
    kt = torch.randn(1, NUM_KV_HEADS, num_tokens, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    vt = torch.randn_like(kt)
    ms = bench_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                                         enable_gqa=True))
    rows.append({"case": f"prefill {num_tokens}", "variant": "torch sdpa (contiguous)", "ms": ms,
                 "tflops": flops / ms / 1e9, "ok": True})
    return rows


def kv_write_rows() -> list[dict]:
    rows = []
    for num_tokens in (128, 8192):
        step = make_step(1, 0, num_tokens, seed=3)
        _, k, v, kv_cache, meta = step
        nbytes = 2 * 2 * k.numel() * k.element_size()  # read + write, K and V
        expected = kv_cache.clone()
        write_kv_cache(k, v, expected, meta.slot_mapping)
        kv_cache.zero_()
        triton_write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        written = kv_cache.view(2, -1, NUM_KV_HEADS, HEAD_DIM)[:, meta.slot_mapping]
        ok = torch.equal(written, expected.view(2, -1, NUM_KV_HEADS, HEAD_DIM)[:, meta.slot_mapping])
        for label, fn in [("triton fused", triton_write_kv_cache), ("torch index_copy_",
                                                                     write_kv_cache)]:
            call = lambda: fn(k, v, kv_cache, meta.slot_mapping)  # noqa: E731
            ms, g_ms = bench_ms(call), graph_ms(call)
            rows.append({"case": f"kv write T={num_tokens}", "variant": label, "ms": ms,
                         "graph_ms": g_ms, "gbs": nbytes / g_ms / 1e6, "ok": ok})
    return rows


def print_table(rows: list[dict], copy_gbs: float) -> None:
    print(f"\ndevice-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    print("time: do_bench median, L2 flushed; graph: the same call replayed from a CUDA graph "
          "(GB/s and %copy from graph time where there is one)")
    print(f"{'case':18s} {'variant':26s} {'time us':>9s} {'graph us':>9s} {'GB/s':>7s} "
          f"{'%copy':>6s} {'TFLOP/s':>8s} {'rel err':>8s} ok")
    for r in rows:
        gbs = f"{r['gbs']:.0f}" if "gbs" in r else ""
        pct = f"{r['pct_copy']:.0f}" if "pct_copy" in r else ""
        tfl = f"{r['tflops']:.0f}" if "tflops" in r else ""
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        graph = f"{r['graph_ms'] * 1e3:.1f}" if r.get("graph_ms") else ""
        print(f"{r['case']:18s} {r['variant']:26s} {r['ms'] * 1e3:9.1f} {graph:>9s} {gbs:>7s} {pct:>6s} "
              f"{tfl:>8s} {err:>8s} {'yes' if r['ok'] else 'NO'}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    tests = None if args.skip_tests else run_tests()
    copy_gbs = copy_bandwidth_gbs()
    rows = []
    for batch in (1, 32, 128):
        rows += decode_rows(batch, copy_gbs)
    rows += prefill_rows(8192)
    rows += kv_write_rows()
    if tests:
        print(f"\ntests: {tests['summary']} (rc {tests['returncode']}, {tests['seconds']} s)")
    print_table(rows, copy_gbs)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "attention_check.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "copy_gbs": copy_gbs, "tests": tests,
                       "rows": rows}, f, indent=1)
    ok = all(r["ok"] for r in rows) and (tests is None or tests["returncode"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
