"""Kernel probe on the GPU: the pieces of a decode step and a long prefill, each against its limit.

Prints (and with --json writes) for the 8B and 32B presets' shapes:
- prefill attention of one L-token prompt (L = 8k, 32k): the Triton paged kernel against torch's
  scaled_dot_product_attention backends (flash, cuDNN, memory-efficient), TFLOP/s and the
  largest difference from the Triton output;
- decode attention (batch 1, 4, 32, 128): the current launch plan against other tile / split
  shapes, each launch over its own copy of the cache (a step's layers do not find their KV in L2);
- the projections at M = 1, 32, 128 (decode) and 8192 (prefill): F.linear (cuBLAS) in GB/s of
  weights read and TFLOP/s;
- ``balance``: decode attention over unequal contexts (GovReport-like, 4.5k-17.4k tokens) and
  equal ones, one program per (sequence, KV head) against fixed-size KV segments;
- ``chunks``: a short prompt chunk over a long context beside 32 decodes (a step under a prefill
  attention budget), the planned launch (balanced segments) against no split;
- ``dense``: steps with long prompt chunks (fresh, or over cached context, beside decodes or
  alone) through the backend's fused-kernel path against the paged kernel alone;
- ``builds``: the host cost of a new shape for the fused kernels (cuDNN's graph per shape);
- ``layouts``: fresh-prompt attention as the engine calls it (q, k, v strided views of one fused
  projection) against contiguous inputs, one prompt and several, and torch's varlen kernels;
- ``blas``: each projection through cuBLAS (torch's default) against cuBLASLt, at M = 1, 4, 32,
  128 and 8192 or ``--blas-m``;
- ``gemv``: the projections at M = 1 through cuBLAS against hifc's Triton GEMV, in several
  configurations;
- ``rows``: the projections at M = 2..32 (``--rows-m``) through cuBLAS against hifc's small-M
  Triton kernel (tensor cores over a 16- or 32-row tile), in several configurations;
- ``prologues``: at M = 1, RMSNorm then the QKV / gate-up GEMV and SiLU-and-mul then the down
  GEMV, as two launches against one (the GEMV computing its input), and the GEMV alone; the O
  GEMV, residual add and norm, and gate-up GEMV as three launches against two;
- ``prefetch``: decode attention then the output projection, per layer, serially and with the
  projection's weight prefetched into L2 on a side stream during the attention;
- ``versions``: decode attention of this module against another copy of it
  (``--other-module``), each with its plan for the CUDA graph's context cap.
- ``chain``: decode layers less their MLP (QKV projection, attention with its new K/V, O
  projection) in one CUDA graph, the backend's path against its RoPE, merge and stage choices
  each forced the other way, at 4k contexts and just past the 4,096-key graph cap (there also
  other shapes of the balanced split and an even split; under it balanced segments or no split
  for the crowded batches 64 and 128).

Usage: PYTHONPATH=$PWD python3 scripts/gpu_kernel_probe.py [--parts prefill,decode,gemm] [--json F]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from hifc.bench.probes import profile_kernels
from hifc.layers.attention import AttentionMetadata, write_kv_cache
from hifc.layers.triton_attention import (LaunchPlan, TritonAttentionBackend, paged_attention,
                                          plan_launch)
from hifc.layers import triton_fused, triton_pdl
from hifc.layers.triton_gemv import (ROWS_SHARED_BYTES, gemm_rows, gemv, gemv_add_sumsq,
                                     gemv_norm_sumsq, gemv_rms_norm, gemv_silu_mul, rows_block_m,
                                     rows_config)

BLOCK = 64
SHAPES = {"8b": dict(hq=32, hkv=8, d=128, hidden=4096, inter=14336, vocab=128256),
          "32b": dict(hq=40, hkv=8, d=128, hidden=5120, inter=27648, vocab=152064)}


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=40)


def graph_ms(calls, replays: int = 10) -> float:
    """Mean time of one of ``calls`` (callables) captured together in a CUDA graph, as a decode
    step's graph runs them back to back."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays / len(calls)


@triton.jit
def _skinny_gemm(x_ptr, w_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_len = K // SPLIT_K
    k0 = pid_k * k_len
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + (k0 + offs_k)[None, :]
    m_ok = offs_m[:, None] < M
    n_ok = offs_n[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, k_len, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptrs, mask=m_ok, other=0.0)
        w = tl.load(w_ptrs, mask=n_ok, other=0.0)
        acc += tl.dot(x, tl.trans(w))
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _split_sum(ws_ptr, out_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.load(ws_ptr + offs, mask=ok, other=0.0)
    for i in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + i * MN + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


def skinny_linear(x, w, out, ws, block_n, block_k, split_k, stages, warps):
    m, k = x.shape
    n = w.shape[0]
    block_m = max(16, triton.next_power_of_2(m))
    _skinny_gemm[(triton.cdiv(n, block_n), split_k)](
        x, w, out, ws, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, STAGES=stages,
        num_warps=warps)
    if split_k > 1:
        _split_sum[(triton.cdiv(m * n, 1024),)](ws, out, m * n, SPLIT_K=split_k, BLOCK=1024)


def token_slots(tables, seq_lens, query_lens):
    """The cache slots of each sequence's last query_lens[i] tokens (tables on the host)."""
    positions = [torch.arange(sl - q, sl) for sl, q in zip(seq_lens, query_lens)]
    return torch.cat([tables[i, pos // BLOCK] * BLOCK + pos % BLOCK
                      for i, pos in enumerate(positions)])


def build_cache(seq_lens, hkv, d, dtype, dev):
    blocks = [-(-s // BLOCK) for s in seq_lens]
    kv = torch.empty(2, sum(blocks) + 1, BLOCK, hkv, d, dtype=dtype, device=dev)
    width = max(blocks)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    start = 1
    for i, nb in enumerate(blocks):
        tables[i, :nb] = torch.arange(start, start + nb)
        start += nb
    slots = token_slots(tables, seq_lens, seq_lens)
    k = torch.randn(len(slots), hkv, d, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    write_kv_cache(k, v, kv, slots.to(dev).long())
    return kv, tables.to(dev), k, v


def meta_for(seq_lens, query_lens, tables, dev):
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.zeros(qsl[-1], dtype=torch.long, device=dev),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables, query_start_loc_cpu=qsl, seq_lens_cpu=list(seq_lens),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=BLOCK)


def decode_step(s, seq_lens, dev, dtype):
    """A decode step over seq_lens: q, its metadata, and copies of its cache that together
    exceed the L2 cache many times over (a step's layers each read their own)."""
    kv, tables, _, _ = build_cache(seq_lens, s["hkv"], s["d"], dtype, dev)
    copies = [kv] + [kv.clone() for _ in range(max(1, (512 << 20) // kv.numel() //
                                                  kv.element_size()))]
    q = torch.randn(len(seq_lens), s["hq"], s["d"], device=dev, dtype=dtype)
    return q, meta_for(seq_lens, [1] * len(seq_lens), tables, dev), copies


def prefill_attention(name, s, length, dev, dtype):
    kv, tables, k, v = build_cache([length], s["hkv"], s["d"], dtype, dev)
    q = torch.randn(length, s["hq"], s["d"], device=dev, dtype=dtype)
    meta = meta_for([length], [length], tables, dev)
    scale = s["d"] ** -0.5
    backend = TritonAttentionBackend()
    plan = backend.plan(q, kv, meta)
    flops = 4 * s["hq"] * s["d"] * length * length / 2
    rows = []
    ref = paged_attention(q, kv, meta, scale, plan)
    t = bench_ms(lambda: paged_attention(q, kv, meta, scale, plan))
    rows.append({"kernel": f"triton paged {plan}", "ms": t, "tflops": flops / t / 1e9,
                 "max_diff": 0.0})
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, L, D]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    group = s["hq"] // s["hkv"]
    for label, be in [("sdpa flash", SDPBackend.FLASH_ATTENTION),
                      ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                      ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        for gqa in ("enable_gqa", "expand"):
            try:
                with sdpa_kernel([be]):
                    if gqa == "enable_gqa":
                        fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                            qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
                    else:
                        fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                            qs, ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1),
                            is_causal=True, scale=scale)
                    out = fn()
                    t = bench_ms(fn)
                diff = (out[0].transpose(0, 1).float() - ref.float()).abs().max().item()
                rows.append({"kernel": f"{label} ({gqa})", "ms": t, "tflops": flops / t / 1e9,
                             "max_diff": diff})
            except Exception as e:  # noqa: BLE001 - a backend that refuses is a result
                rows.append({"kernel": f"{label} ({gqa})", "error": str(e)[:160]})
    for r in rows:
        r.update(model=name, tokens=length)
    del kv, q, k, v
    torch.cuda.empty_cache()
    return rows


def decode_attention(name, s, batch, context, dev, dtype, copy_gbps):
    """Every plan over copies of the cache that together exceed the L2 cache many times over,
    one copy per launch in turn, as a step's layers each read their own cache. "current" is the
    plan for contexts up to exactly ``context``; the engine's graphs plan for their context cap,
    which for a step past a cap is the next one (balanced segments above 4,096 keys)."""
    seq_lens = [context] * batch
    q, meta, copies = decode_step(s, seq_lens, dev, dtype)
    kv = copies[0]
    scale = s["d"] ** -0.5
    backend = TritonAttentionBackend()
    current = backend.plan(q, kv, meta)
    kv_bytes = 2 * batch * context * s["hkv"] * s["d"] * kv.element_size()
    floor_ms = kv_bytes / copy_gbps / 1e6
    ref = paged_attention(q, kv, meta, scale, current)
    plans = [current]
    shapes = (((32, 64, 128), (8, 16, 32, 64), ((4, 2), (4, 3), (2, 3), (8, 2)))
              if batch <= 8 else ((64, 128), (1, 2), ((4, 2), (4, 3), (8, 2))))
    for tile in shapes[0]:
        for segs in shapes[1]:
            for warps, stages in shapes[2]:
                plans.append(LaunchPlan(current.block_m, current.block_q, tile, segs, warps,
                                        stages))
    rows = []
    outs = [torch.empty_like(q) for _ in copies]
    for plan in plans:
        try:
            out = paged_attention(q, kv, meta, scale, plan)
            t = graph_ms([lambda o=o, c=c: paged_attention(q, c, meta, scale, plan, o)
                          for o, c in zip(outs, copies)] * max(1, 32 // len(copies)))
            rows.append({"plan": str(plan), "current": plan == current, "ms": t,
                         "over_floor": t / floor_ms,
                         "max_diff": (out.float() - ref.float()).abs().max().item()})
        except Exception as e:  # noqa: BLE001
            rows.append({"plan": str(plan), "error": str(e)[:160]})
    rows.sort(key=lambda r: r.get("ms", 1e9))
    for r in rows:
        r.update(model=name, batch=batch, context=context, floor_ms=floor_ms,
                 cache_copies=len(copies))
    del kv, copies
    torch.cuda.empty_cache()
    return rows


def balance(name, s, dev, dtype, copy_gbps):
    """Decode attention over unequal and equal contexts: the current plan against fixed-size
    segments (segment_tiles x tile keys), with as many segments as a max_model_len of 32k needs
    (what a CUDA graph plans with) and as the batch's longest needs."""
    import random
    rng = random.Random(0)
    cases = [("govreport", [rng.randrange(4500, 17400) for _ in range(32)]),
             ("govreport", [rng.randrange(4500, 17400) for _ in range(64)]),
             ("equal", [4096] * 32), ("equal", [4096] * 128), ("equal", [1100] * 32),
             ("short-mixed", [rng.randrange(200, 3000) for _ in range(128)])]
    rows = []
    scale = s["d"] ** -0.5
    for label, seq_lens in cases:
        batch = len(seq_lens)
        kv, tables, _, _ = build_cache(seq_lens, s["hkv"], s["d"], dtype, dev)
        q = torch.randn(batch, s["hq"], s["d"], device=dev, dtype=dtype)
        meta = meta_for(seq_lens, [1] * batch, tables, dev)
        current = TritonAttentionBackend().plan(q, kv, meta)
        floor_ms = 2 * sum(seq_lens) * s["hkv"] * s["d"] * kv.element_size() / copy_gbps / 1e6
        ref = paged_attention(q, kv, meta, scale, current)
        plans = {"current": current,
                 "no split": LaunchPlan(current.block_m, current.block_q, 128, 1, 4, 2)}
        tiles = -(-max(seq_lens) // 128)
        for seg in (8, 16, 32, 64):
            for bound, width in (("longest", tiles), ("32k", 256)):
                n = 1 << max(0, (-(-width // seg) - 1).bit_length())
                if n > 1:
                    plans[f"seg {seg} tiles, {bound} ({n})"] = LaunchPlan(
                        current.block_m, current.block_q, 128, n, 4, 2, seg)
        outs = [torch.empty_like(q) for _ in range(8)]
        for key, plan in plans.items():
            out = paged_attention(q, kv, meta, scale, plan)
            t = graph_ms([lambda o=o, p=plan: paged_attention(q, kv, meta, scale, p, o)
                          for o in outs] * 4)
            rows.append({"model": name, "case": label, "batch": batch,
                         "mean_len": sum(seq_lens) / batch, "max_len": max(seq_lens),
                         "plan": key, "detail": str(plan), "us": t * 1e3,
                         "over_floor": t / floor_ms,
                         "max_diff": (out.float() - ref.float()).abs().max().item()})
        del kv
        torch.cuda.empty_cache()
    return rows


def versions(name, s, dev, dtype, copy_gbps, other_path):
    """Decode attention of this module against another version of it (``--other-module``: a
    copy of hifc/layers/triton_attention.py), each with its own plan for the CUDA graph's
    context cap, over copies of the cache well past the L2 cache: contexts just past the
    4,096-key cap, past it by more, GovReport-like ones, and short ones."""
    import importlib.util
    import random
    spec = importlib.util.spec_from_file_location("other_triton_attention", other_path)
    other = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = other  # its dataclasses look their module up
    spec.loader.exec_module(other)
    rng = random.Random(0)
    cases = [(f"past the cap b{b}", [4128] * b, 8193) for b in (1, 4, 32, 128)]
    cases += [("700 past the cap b32", [4796] * 32, 8193), ("equal 2000 b4", [2000] * 4, 4096),
              ("govreport b32", [rng.randrange(4500, 17400) for _ in range(32)], 32768),
              ("govreport b64", [rng.randrange(4500, 17400) for _ in range(64)], 32768)]
    scale = s["d"] ** -0.5
    num_sms = triton_pdl.sm_count(dev)
    rows = []
    for label, seq_lens, cap in cases:
        batch = len(seq_lens)
        q, meta, copies = decode_step(s, seq_lens, dev, dtype)
        kv = copies[0]
        floor_ms = 2 * sum(seq_lens) * s["hkv"] * s["d"] * kv.element_size() / copy_gbps / 1e6
        outs = [torch.empty_like(q) for _ in copies]
        row = {"model": name, "case": label, "batch": batch, "cap": cap, "floor_us": floor_ms * 1e3}
        results = {}
        for version, module in (("this", None), ("other", other)):
            attend = paged_attention if module is None else module.paged_attention
            plan_for = plan_launch if module is None else module.plan_launch
            plan = plan_for(1, cap, batch, s["hq"], s["hkv"], s["d"], 2, num_sms)
            results[version] = attend(q, kv, meta, scale, plan)
            t = graph_ms([lambda o=o, c=c: attend(q, c, meta, scale, plan, o)
                          for o, c in zip(outs, copies)] * max(1, 32 // len(copies)))
            row[f"{version}_us"] = t * 1e3
            row[f"{version}_plan"] = str(plan)
        row["this_over_other"] = row["this_us"] / row["other_us"]
        row["max_diff"] = (results["this"].float() - results["other"].float()).abs().max().item()
        rows.append(row)
        del kv, copies
        torch.cuda.empty_cache()
    return rows


def chunks(name, s, dev, dtype):
    """A prompt chunk of c tokens after p computed ones, beside 32 decodes of ~1.1k-token
    contexts (and alone): the planned launch (balanced segments for short steps over long
    contexts) against one program per q block; time per launch and the chunk's TFLOP/s."""
    rows = []
    scale = s["d"] ** -0.5
    hq, d = s["hq"], s["d"]
    for context in (4096, 16384, 32000):
        for size in (32, 64, 128, 256, 512):
            for decoders in ((32, 0) if size in (64, 512) else (32,)):
                seq_lens = [1100] * decoders + [context + size]
                query_lens = [1] * decoders + [size]
                kv, tables, _, _ = build_cache(seq_lens, s["hkv"], d, dtype, dev)
                q = torch.randn(sum(query_lens), hq, d, device=dev, dtype=dtype)
                meta = meta_for(seq_lens, query_lens, tables, dev)
                pairs = size * context + size * (size + 1) // 2 + 1100 * decoders
                planned = TritonAttentionBackend().plan(q, kv, meta)
                plans = {"planned": planned,
                         "no split": TritonAttentionBackend(split_kv=False).plan(q, kv, meta),
                         "8 x 4096 keys": dataclasses.replace(
                             planned, num_segments=8, segment_tiles=4096 // planned.tile)}
                ref = paged_attention(q, kv, meta, scale, plans["no split"])
                out = torch.empty_like(q)
                for key, plan in plans.items():
                    got = paged_attention(q, kv, meta, scale, plan, out)
                    t = bench_ms(lambda p=plan: paged_attention(q, kv, meta, scale, p, out))
                    rows.append({"model": name, "context": context, "chunk": size,
                                 "decoders": decoders, "plan": key, "segments": plan.num_segments,
                                 "segment_tiles": plan.segment_tiles,
                                 "us": t * 1e3, "tflops": 4 * hq * d * pairs / t / 1e9,
                                 "max_diff": (got.float() - ref.float()).abs().max().item()})
                del kv
                torch.cuda.empty_cache()
    return rows


def dense(name, s, dev, dtype):
    """Steps with long prompt chunks: the backend's fused-kernel path for chunks (over cached
    context: two calls merged by log-sum-exp) against the paged kernel alone, beside 32 decodes
    of 1.1k-token contexts or alone; time per call (K/V write included) and TFLOP/s."""
    rows = []
    scale = s["d"] ** -0.5
    hq, hkv, d = s["hq"], s["hkv"], s["d"]
    cases = [  # (chunks as (context, tokens), decoders)
        ([(8192, 532), (0, 7628)], 32),  # a GovReport-like step: one prompt's tail, the next's head
        ([(8192, 532)], 32), ([(0, 8192)], 32), ([(16384, 2048)], 32),
        ([(8192, 8192)], 0), ([(24576, 8192)], 0), ([(4096, 1024)] * 4, 0)]
    for chunk_list, decoders in cases:
        seq_lens = [1100] * decoders + [c + n for c, n in chunk_list]
        query_lens = [1] * decoders + [n for _, n in chunk_list]
        kv, tables, all_k, all_v = build_cache(seq_lens, hkv, d, dtype, dev)
        # the new tokens' K/V are the cache's own (the write is idempotent), so both paths agree
        ends = torch.tensor(seq_lens).cumsum(0).tolist()
        new = torch.cat([torch.arange(end - q, end) for end, q in zip(ends, query_lens)])
        k, v = all_k[new.to(dev)], all_v[new.to(dev)]
        meta = meta_for(seq_lens, query_lens, tables, dev)
        meta.slot_mapping = token_slots(tables.cpu(), seq_lens, query_lens).to(dev).long()
        q = torch.randn(sum(query_lens), hq, d, device=dev, dtype=dtype)
        pairs = sum(n * c + n * (n + 1) // 2 for c, n in chunk_list) + 1100 * decoders
        flops = 4 * hq * d * pairs
        out = torch.empty_like(q)
        results = {}
        for key, backend in (("fused", TritonAttentionBackend(dense_prefill=True)),
                             ("paged", TritonAttentionBackend(dense_prefill=False))):
            results[key] = backend.forward(q, k, v, kv, meta, scale, out=out).clone()
            t = bench_ms(lambda b=backend: b.forward(q, k, v, kv, meta, scale, out=out))
            kernels = profile_kernels(lambda b=backend: [b.forward(q, k, v, kv, meta, scale,
                                                                   out=out) for _ in range(5)],
                                      top=1000)
            device_ms = sum(x["ms"] for x in kernels) / 5
            rows.append({"model": name, "chunks": chunk_list, "decoders": decoders,
                         "path": key, "ms": t, "tflops": flops / t / 1e9,
                         "device_ms": device_ms, "device_tflops": flops / device_ms / 1e9,
                         "kernels": [(x["name"][:50], x["calls"] / 5, round(x["ms"] / 5, 4))
                                     for x in kernels[:5]]})
        rows[-2]["max_diff_vs_paged"] = (results["fused"].float()
                                         - results["paged"].float()).abs().max().item()
        del kv, all_k, all_v
        torch.cuda.empty_cache()
    return rows


def builds(name, s, dev, dtype):
    """What a new shape costs the fused kernels: the first call of each new length (cuDNN
    builds and caches an execution graph per shape) against a repeated one, host wall time
    with a sync, for a fresh prompt (causal) and a chunk over cached context (no mask, with
    log-sum-exp); torch's flash kernel beside them; and cuDNN with a key-padding bias
    ([1, 1, 1, keys], -inf on padded keys), whose shapes could be bucketed."""
    import time
    from torch.nn.attention import SDPBackend, sdpa_kernel
    hq, hkv, d = s["hq"], s["hkv"], s["d"]
    scale = d ** -0.5
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    flash = torch.ops.aten._scaled_dot_product_flash_attention

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def qkv(n, keys):
        q = torch.randn(1, n, hq, d, device=dev, dtype=dtype).transpose(1, 2)
        k = torch.randn(1, keys, hkv, d, device=dev, dtype=dtype).transpose(1, 2)
        return q, k, torch.randn_like(k)

    rows = []
    for n in (1500, 1501, 1502, 7628):
        q, k, v = qkv(n, n)

        def fresh(q=q, k=k, v=v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                               enable_gqa=True)
        rows.append({"model": name, "call": "cudnn causal (fresh prompt)", "tokens": n,
                     "keys": n, "first_ms": timed(fresh), "again_ms": timed(fresh)})
    for n in (532, 533, 534, 2048):
        q, k, v = qkv(n, 8192)
        for label, fn in (
                ("cudnn over context, lse", lambda q=q, k=k, v=v: cudnn(
                    q, k, v, None, True, 0.0, False, False, scale=scale)),
                ("flash over context, lse", lambda q=q, k=k, v=v: flash(
                    q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1),
                    0.0, False, False, scale=scale))):
            rows.append({"model": name, "call": label, "tokens": n, "keys": 8192,
                         "first_ms": timed(fn), "again_ms": timed(fn)})
    for n, keys, bucket in ((8192, 8192, 8192), (8192, 8000, 8192), (532, 8000, 8192)):
        q, k, v = qkv(n, bucket)
        bias = torch.zeros(1, 1, 1, bucket, device=dev, dtype=dtype)
        bias[..., keys:] = float("-inf")
        fn = (lambda q=q, k=k, v=v, b=bias: cudnn(q, k, v, b.expand(1, hq, n, bucket), True,
                                                  0.0, False, False, scale=scale))
        row = {"model": name, "call": "cudnn over context, key-padding bias", "tokens": n,
               "keys": keys, "bucket": bucket}
        try:
            row.update(first_ms=timed(fn), again_ms=timed(fn), bench_ms=bench_ms(fn))
            plain = (lambda q=q, k=k, v=v: cudnn(q, k[:, :, :keys], v[:, :, :keys], None, True,
                                                  0.0, False, False, scale=scale))
            row["unpadded_bench_ms"] = bench_ms(plain)
        except Exception as e:  # noqa: BLE001 - a kernel that refuses is a result
            row["error"] = str(e)[:200]
        rows.append(row)
    return rows


def layouts(name, s, dev, dtype):
    """Fresh prompts' attention: SDPA on strided views of a fused qkv output (as the engine
    calls it, plus the copy back into [T, Hq, D]) against contiguous [1, H, L, D] inputs, per
    prompt; torch's varlen flash and cuDNN kernels over the packed batch; the Triton kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from hifc.layers.dense_attention import dense_prefill_attention
    hq, hkv, d = s["hq"], s["hkv"], s["d"]
    scale = d ** -0.5
    rows = []
    for lens in ([8192], [4096] * 2, [2048] * 4, [1024] * 8, [1024] * 32, [512] * 16):
        total = sum(lens)
        qkv = torch.randn(total, (hq + 2 * hkv) * d, device=dev, dtype=dtype)
        q = qkv[:, :hq * d].view(total, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(total, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(total, hkv, d)
        kv, tables, _, _ = build_cache(lens, hkv, d, dtype, dev)  # other K/V: Triton's diff
        meta = meta_for(lens, lens, tables, dev)
        flops = sum(4 * hq * d * n * n / 2 for n in lens)
        out = torch.empty(total, hq, d, device=dev, dtype=dtype)
        ref = dense_prefill_attention(q, k, v, kv, meta, scale, out).clone()
        cu = meta.query_start_loc
        qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
        group = hq // hkv
        ke, ve = kc.repeat_interleave(group, 1), vc.repeat_interleave(group, 1)
        contiguous = [(x[a:b].transpose(0, 1).unsqueeze(0).contiguous() for x in (qc, kc, vc))
                      for a, b in zip(meta.query_start_loc_cpu, meta.query_start_loc_cpu[1:])]
        contiguous = [tuple(c) for c in contiguous]

        def per_prompt_contiguous():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                for qs, ks, vs in contiguous:
                    F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                   enable_gqa=True)

        def flash_varlen():
            return torch.ops.aten._flash_attention_forward(
                q, k, v, cu, cu, max(lens), max(lens), 0.0, True, False, scale=scale)[0]

        def cudnn_varlen():
            return torch.ops.aten._cudnn_attention_forward(
                qc, ke, ve, None, cu, cu, max(lens), max(lens), False, 0.0, True, False,
                scale=scale)[0]

        plan = TritonAttentionBackend().plan(q, kv, meta)
        variants = {"engine path (strided views, copy out)":
                    lambda: dense_prefill_attention(q, k, v, kv, meta, scale, out),
                    "per prompt, contiguous [1,H,L,D]": per_prompt_contiguous,
                    "flash varlen (packed, GQA)": flash_varlen,
                    "cudnn varlen (packed, K/V expanded)": cudnn_varlen,
                    "triton paged": lambda: paged_attention(q, kv, meta, scale, plan, out)}
        for key, fn in variants.items():
            row = {"model": name, "prompts": len(lens), "tokens": lens[0], "variant": key}
            try:
                got = fn()
                if isinstance(got, torch.Tensor) and got.shape == ref.shape:
                    row["max_diff"] = (got.float() - ref.float()).abs().max().item()
                t = bench_ms(fn)
                row.update(ms=t, tflops=flops / t / 1e9)
                # device time alone (the wall time above includes host work per call)
                kernels = profile_kernels(lambda: [fn() for _ in range(5)], top=1000)
                row["device_ms"] = sum(k["ms"] for k in kernels) / 5
                row["device_tflops"] = flops / row["device_ms"] / 1e9
                row["kernels"] = [(k["name"][:60], k["calls"] / 5, round(k["ms"] / 5, 4))
                                  for k in kernels[:4]]
            except Exception as e:  # noqa: BLE001 - a kernel that refuses is a result
                row["error"] = str(e)[:200]
            rows.append(row)
        del qkv, kv, qc, kc, vc, ke, ve, contiguous
        torch.cuda.empty_cache()
    return rows


def projection_shapes(s) -> dict[str, tuple[int, int]]:
    h, i = s["hidden"], s["inter"]
    qkv = (s["hq"] + 2 * s["hkv"]) * s["d"]
    return {"qkv": (qkv, h), "o": (h, s["hq"] * s["d"]), "gate_up": (2 * i, h),
            "down": (h, i), "lm_head": (s["vocab"], h)}


def weight_copies(n, k, dev, dtype):
    """Several copies of an [n, k] weight, together well past the L2 cache."""
    copies = max(2, min(8, (2 << 30) // (n * k * 2)))
    return [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(copies)]


def gemms(name, s, dev, dtype):
    shapes = projection_shapes(s)
    rows = []
    configs = [(bn, bk, sk, 4, 4) for bn in (32, 64, 128) for bk in (128, 256)
               for sk in (1, 2, 4)]
    for label, (n, k) in shapes.items():
        ws_ = weight_copies(n, k, dev, dtype)
        for m in (1, 32, 128, 8192):
            if m == 8192 and label == "lm_head":
                continue
            x = torch.randn(m, k, device=dev, dtype=dtype)
            ref = F.linear(x, ws_[0]).float()
            if m == 8192:
                t = bench_ms(lambda: F.linear(x, ws_[0]))
            else:
                t = graph_ms([lambda w=w: F.linear(x, w) for w in ws_] * 2)
            row = {"model": name, "proj": label, "m": m, "n": n, "k": k, "ms": t,
                   "weight_gbps": n * k * 2 / t / 1e6, "tflops": 2 * m * n * k / t / 1e9}
            if m <= 32 and label != "lm_head":
                out = torch.empty(m, n, device=dev, dtype=dtype)
                work = torch.empty(4 * m * n, device=dev, dtype=torch.float32)
                best = None
                for cfg in configs:
                    if k % (cfg[2] * cfg[1]):
                        continue
                    try:
                        skinny_linear(x, ws_[0], out, work, *cfg)
                        err = ((out.float() - ref).norm() / ref.norm()).item()
                        tc = graph_ms([lambda w=w: skinny_linear(x, w, out, work, *cfg)
                                       for w in ws_] * 2)
                    except Exception as e:  # noqa: BLE001
                        row.setdefault("errors", []).append(f"{cfg}: {str(e)[:100]}")
                        continue
                    if best is None or tc < best[0]:
                        best = (tc, cfg, err)
                if best:
                    row.update(triton_ms=best[0], triton_cfg=best[1], triton_rel_err=best[2],
                               triton_gbps=n * k * 2 / best[0] / 1e6,
                               triton_over_cublas=best[0] / t)
            rows.append(row)
        del ws_
        torch.cuda.empty_cache()
    return rows


CONFIG_KEYS = ("block_n", "block_k", "stages", "warps")


def sweep_configs(kernel, x, ws_, configs, keep, **fields):
    """cuBLAS against ``kernel(x, w, out=..., **config)`` for each configuration (a tuple in
    CONFIG_KEYS order), timed over the weight copies in CUDA graphs. Returns the row (fields,
    the cuBLAS time, the ``keep`` fastest configurations; failed ones under "errors") and every
    timed configuration as (ms, config, relative error), fastest first."""
    n, k = ws_[0].shape
    ref = F.linear(x, ws_[0]).float()
    t = graph_ms([lambda w=w: F.linear(x, w) for w in ws_] * 2)
    row = {**fields, "n": n, "k": k, "cublas_us": t * 1e3, "cublas_gbps": n * k * 2 / t / 1e6}
    out = torch.empty(x.shape[0], n, device=x.device, dtype=x.dtype)
    tried = []
    for cfg in configs:
        config = dict(zip(CONFIG_KEYS, cfg))
        try:
            kernel(x, ws_[0], out=out, **config)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            tc = graph_ms([lambda w=w: kernel(x, w, out=out, **config) for w in ws_] * 2)
        except Exception as e:  # noqa: BLE001
            row.setdefault("errors", []).append(f"{cfg}: {str(e)[:100]}")
            continue
        tried.append((tc, cfg, err))
    tried.sort()
    row["best"] = [{"us": tc * 1e3, "cfg": cfg, "rel_err": err, "gbps": n * k * 2 / tc / 1e6,
                    "over_cublas": tc / t} for tc, cfg, err in tried[:keep]]
    return row, tried


def gemvs(name, s, dev, dtype):
    """One-row projections (a batch-1 decode step's): cuBLAS against hifc's Triton GEMV over a
    range of configurations (rows per program, K slice, stages, warps), over weight copies that
    do not fit the L2 cache; the best configurations per projection."""
    rows = []
    configs = [(bn, bk, st, wp) for bn in (8, 16, 32) for bk in (512, 1024) for st in (1, 3)
               for wp in (4, 8)]
    for label, (n, k) in projection_shapes(s).items():
        if label == "lm_head":
            continue
        ws_ = weight_copies(n, k, dev, dtype)
        x = torch.randn(1, k, device=dev, dtype=dtype)
        configs_k = [c for c in configs if not k % c[1] and c[0] * c[1] <= 16384]
        rows.append(sweep_configs(gemv, x, ws_, configs_k, 5, model=name, proj=label)[0])
        del ws_
        torch.cuda.empty_cache()
    return rows


def rows_configs(block_m: int) -> list[tuple[int, ...]]:
    """The small-M kernel's configurations the probe sweeps for a row tile of block_m: those
    whose stages fit the shared memory (CONFIG_KEYS order)."""
    if block_m <= 16:
        return [(bn, bk, st, 4) for bn in (16, 32, 64) for bk in (128, 256, 512)
                for st in (3, 4) if 2048 <= bn * bk <= 16384]
    return [(bn, bk, st, wp) for bn in (32, 64, 128) for bk in (128, 256, 512)
            for st in (3, 4) for wp in (4, 8)
            if 4096 <= bn * bk <= 32768 and (block_m + bn) * bk * 2 * st <= ROWS_SHARED_BYTES
            and (wp == 4 or bn == 128)]


def rows_part(name, s, dev, dtype, ms=(2, 4, 8, 16, 24, 32)):
    """Projections at M = ms (small decode batches): cuBLAS against hifc's small-M kernel
    over a range of configurations, over weight copies that do not fit the L2 cache; the best
    configurations per projection and M, and the module's default configuration.

    The launches run back to back, each waiting under PDL for the one before; a step puts
    other kernels between them. A grid that leaves SMs idle can time slower here than in a
    step: timed so, the 32B down projection's 80 programs took 110 us at 32 rows and a tiling
    split three ways over K 100 us, yet the engine's steps were level with either
    (docs/RESULTS.md, 2026-12-06)."""
    rows = []
    sms = triton_pdl.sm_count(dev)
    for label, (n, k) in projection_shapes(s).items():
        if label == "lm_head":
            continue
        ws_ = weight_copies(n, k, dev, dtype)
        for m in ms:
            default = tuple(rows_config(n, m, sms)[key] for key in CONFIG_KEYS)
            x = torch.randn(m, k, device=dev, dtype=dtype)
            configs = [c for c in rows_configs(rows_block_m(m)) if not k % c[1]]
            row, tried = sweep_configs(gemm_rows, x, ws_, configs, 4, model=name, proj=label,
                                       m=m)
            row["default_us"] = next((tc * 1e3 for tc, cfg, _ in tried if cfg == default), None)
            rows.append(row)
        del ws_
        torch.cuda.empty_cache()
    return rows


def prologues(name, s, dev, dtype):
    """One-row projections with the elementwise kernel before them: the two launches the engine
    ran (rms_norm or silu_and_mul, then the GEMV) against the fused GEMV, and the GEMV alone,
    over weight copies that do not fit the L2 cache (us per projection, in CUDA graphs)."""
    rows = []
    h = s["hidden"]
    norm_w = torch.rand(h, device=dev, dtype=dtype) + 0.5
    for label, (n, k) in projection_shapes(s).items():
        if label not in ("qkv", "gate_up", "down"):
            continue
        ws_ = weight_copies(n, k, dev, dtype)
        if label == "down":
            x = torch.randn(1, 2 * k, device=dev, dtype=dtype)
            alone_x = triton_fused.silu_and_mul(x)

            def two(w):
                return gemv(triton_fused.silu_and_mul(x), w)

            def one(w):
                return gemv_silu_mul(x, w)
        else:
            x, r = torch.randn(1, k, device=dev, dtype=dtype), torch.randn(1, k, device=dev,
                                                                          dtype=dtype)
            alone_x = triton_fused.rms_norm(x, norm_w, 1e-5, r)[0]

            def two(w):
                return gemv(triton_fused.rms_norm(x, norm_w, 1e-5, r)[0], w)

            def one(w):
                return gemv_rms_norm(x, r, norm_w, 1e-5, False, w)[0]
        ref = two(ws_[0]).float()
        err = ((one(ws_[0]).float() - ref).norm() / ref.norm()).item()
        times = {kind: graph_ms([lambda w=w, f=f: f(w) for w in ws_] * 2) * 1e3
                 for kind, f in (("two_launches_us", two), ("fused_us", one),
                                 ("gemv_alone_us", lambda w: gemv(alone_x, w)))}
        rows.append({"model": name, "proj": label, "n": n, "k": k, **times,
                     "saved_us": times["two_launches_us"] - times["fused_us"], "rel_err": err})
        del ws_
        torch.cuda.empty_cache()
    rows.append(project_then_norm_row(name, s, dev, dtype, norm_w))
    return rows


def project_then_norm_row(name, s, dev, dtype, norm_w):
    """The O projection, the residual add and norm after it, and the gate-up projection at one
    row: three launches (GEMV, rms_norm, GEMV) against two (``gemv_add_sumsq``,
    ``gemv_norm_sumsq``), over weight copies past the L2 cache (us per layer, CUDA graphs)."""
    shapes = projection_shapes(s)
    pairs = list(zip(weight_copies(*shapes["o"], dev, dtype),
                     weight_copies(*shapes["gate_up"], dev, dtype)))
    x = torch.randn(1, shapes["o"][1], device=dev, dtype=dtype)
    r = torch.randn(1, s["hidden"], device=dev, dtype=dtype)

    def three(w_o, w_gu):
        return gemv(triton_fused.rms_norm(gemv(x, w_o), norm_w, 1e-5, r)[0], w_gu)

    def two(w_o, w_gu):
        return gemv_norm_sumsq(*gemv_add_sumsq(x, r, w_o), norm_w, 1e-5, False, w_gu)

    ref = three(*pairs[0]).float()
    err = ((two(*pairs[0]).float() - ref).norm() / ref.norm()).item()
    times = {kind: graph_ms([lambda p=p, f=f: f(*p) for p in pairs] * 2) * 1e3
             for kind, f in (("three_launches_us", three), ("fused_us", two))}
    del pairs
    torch.cuda.empty_cache()
    return {"model": name, "proj": "o + norm + gate_up", **times,
            "saved_us": times["three_launches_us"] - times["fused_us"], "rel_err": err}


def blas(name, s, dev, dtype, ms=(1, 4, 32, 128, 8192)):
    """F.linear through cuBLAS (torch's default) against cuBLASLt, each projection at the
    ``ms`` sizes (decode and prefill), over weight copies that do not fit the L2 cache."""
    rows = []
    for label, (n, k) in projection_shapes(s).items():
        ws_ = weight_copies(n, k, dev, dtype)
        for m in ms:
            if m == 8192 and label == "lm_head":
                continue
            x = torch.randn(m, k, device=dev, dtype=dtype)
            row = {"model": name, "proj": label, "m": m, "n": n, "k": k}
            for lib in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(lib)
                if m == 8192:
                    t = bench_ms(lambda: F.linear(x, ws_[0]))
                else:
                    t = graph_ms([lambda w=w: F.linear(x, w) for w in ws_] * 2)
                row[f"{lib}_ms"] = t
                row[f"{lib}_gbps"] = n * k * 2 / t / 1e6
                row[f"{lib}_tflops"] = 2 * m * n * k / t / 1e9
            torch.backends.cuda.preferred_blas_library("cublas")
            row["lt_over_default"] = row["cublaslt_ms"] / row["cublas_ms"]
            rows.append(row)
        del ws_
        torch.cuda.empty_cache()
    return rows


@triton.jit
def _prefetch_lines(ptr, n_lines, LINES: tl.constexpr):
    """Asks L2 to fetch LINES 128-byte lines of ``ptr`` per program (kept with evict_last)."""
    offs = tl.minimum(tl.program_id(0) * LINES + tl.arange(0, LINES), n_lines - 1)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [ptr.to(tl.pointer_type(tl.int8)) + offs.to(tl.int64) * 128],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_bulk(ptr, n_chunks, CHUNKS: tl.constexpr, CHUNK_BYTES: tl.constexpr):
    """One bulk L2 prefetch (TMA) of CHUNK_BYTES per element, CHUNKS per program."""
    offs = tl.minimum(tl.program_id(0) * CHUNKS + tl.arange(0, CHUNKS), n_chunks - 1)
    tl.inline_asm_elementwise(
        f"cp.async.bulk.prefetch.L2.global [$1], {CHUNK_BYTES}; mov.u32 $0, 0;", "=r,l",
        [ptr.to(tl.pointer_type(tl.int8)) + offs.to(tl.int64) * CHUNK_BYTES],
        dtype=tl.int32, is_pure=False, pack=1)


def l2_prefetch(w, kind, programs):
    nbytes = w.numel() * w.element_size()
    if kind == "lines":
        lines = nbytes // 128
        per = triton.next_power_of_2(triton.cdiv(lines, programs))
        _prefetch_lines[(triton.cdiv(lines, per),)](w, lines, LINES=per, num_warps=4)
    else:
        chunk = 16384
        chunks = nbytes // chunk
        per = triton.next_power_of_2(max(32, triton.cdiv(chunks, programs)))
        _prefetch_bulk[(triton.cdiv(chunks, per),)](w, chunks, CHUNKS=per, CHUNK_BYTES=chunk,
                                                     num_warps=1)


def prefetch(name, s, dev, dtype):
    """A decode step's attention then its output projection, per layer, each layer with its own
    cache and weight: serially, and with the weight prefetched into L2 on a side stream while
    the attention runs (HBM is mostly idle during small batches' attention)."""
    rows = []
    n, k = projection_shapes(s)["o"]
    weights = [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(16)]
    side = torch.cuda.Stream()
    for batch in (1, 4, 32):
        seq_lens = [4096] * batch
        q, meta, copies = decode_step(s, seq_lens, dev, dtype)
        kv = copies[0]
        scale = s["d"] ** -0.5
        plan = TritonAttentionBackend().plan(q, kv, meta)
        outs = [torch.empty_like(q) for _ in weights]

        def layer(i, kind=None, programs=0):
            def run():
                if kind:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        l2_prefetch(weights[i], kind, programs)
                paged_attention(q, copies[i % len(copies)], meta, scale, plan, outs[i])
                if kind:
                    torch.cuda.current_stream().wait_stream(side)
                return F.linear(outs[i].view(batch, -1), weights[i])
            return run

        ref = layer(0)()
        variants = {"serial": [layer(i) for i in range(16)],
                    "attention only": [lambda i=i: paged_attention(
                        q, copies[i % len(copies)], meta, scale, plan, outs[i])
                        for i in range(16)],
                    "o_proj only, cold": [lambda i=i: F.linear(outs[i].view(batch, -1),
                                                               weights[i]) for i in range(16)],
                    "o_proj only, hot": [lambda: F.linear(outs[0].view(batch, -1),
                                                          weights[0])] * 16}
        for kind in ("lines", "bulk"):
            for programs in (8, 32, 132):
                variants[f"prefetch {kind} x{programs}"] = [layer(i, kind, programs)
                                                            for i in range(16)]
        for label, calls in variants.items():
            try:
                t = graph_ms(calls * 2)
                row = {"model": name, "batch": batch, "variant": label, "us": 1000 * t}
                if label.startswith("prefetch"):
                    row["max_diff"] = (calls[0]().float() - ref.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                row = {"model": name, "batch": batch, "variant": label, "error": str(e)[:300]}
            rows.append(row)
        del kv, copies
        torch.cuda.empty_cache()
    return rows


# (batch, context, the graph's context cap): at the 4,096-key cap decode batches of up to 33
# sequences (8 KV heads, 132 SMs) split evenly, larger ones take balanced segments; just past
# it, the next cap's plan splits batch 32 evenly in two
CHAIN_CASES = ((1, 4096, 4096), (4, 4096, 4096), (32, 4096, 4096), (32, 4100, 4190),
               (64, 4096, 4096), (128, 4096, 4096), (128, 4100, 4190))


def chain(name, s, dev, dtype):
    """Decode layers as the engine runs them, less the MLP: the QKV projection, the attention
    with its new K/V (q and k not rotated yet) and the O projection, layer after layer in one
    CUDA graph, each layer with its own weights and cache (us per layer). The backend's path
    against each choice it makes forced the other way: the RoPE + KV-write kernel or RoPE in
    the attention launch, the merge kernel (``MERGE_ROWS`` 0), two stages; and the split's
    other shapes: past the 4,096-key cap balanced segments in 128- or 64-key tiles and an even
    split in two, under it balanced segments for unsplit and crowded plans and no split for
    crowded ones."""
    from hifc.layers import triton_attention
    from hifc.layers.attention import Rope
    from hifc.layers.linear import linear
    from hifc.layers.rotary import RotaryEmbedding
    from hifc.layers.triton_kv_write import rotary_write_kv_cache

    hq, hkv, d = s["hq"], s["hkv"], s["d"]
    (nq, k_in), (no, o_in) = projection_shapes(s)["qkv"], projection_shapes(s)["o"]
    rotary = RotaryEmbedding(d, 16384, 500000.0, None, dtype, dev)
    backend = TritonAttentionBackend()
    scale = d ** -0.5
    rows = []
    for batch, context, cap in CHAIN_CASES:
        layers = 16 if batch <= 4 else 4 if batch <= 32 else 2  # each from HBM, not L2
        seq_lens = [context] * batch
        kv, tables, _, _ = build_cache(seq_lens, hkv, d, dtype, dev)
        caches = [kv] + [kv.clone() for _ in range(layers - 1)]
        meta = dataclasses.replace(
            meta_for(seq_lens, [1] * batch, tables, dev), max_seq_len=cap,
            slot_mapping=token_slots(tables.cpu(), seq_lens, [1] * batch).to(dev))
        rope = Rope(rotary, torch.full((batch,), context - 1, dtype=torch.long, device=dev))
        w_qkv = [torch.randn(nq, k_in, device=dev, dtype=dtype) * 0.02 for _ in caches]
        w_o = [torch.randn(no, o_in, device=dev, dtype=dtype) * 0.02 for _ in caches]
        x = torch.randn(batch, k_in, device=dev, dtype=dtype)
        outs = [torch.empty(batch, hq, d, device=dev, dtype=dtype) for _ in caches]
        plan = backend.plan(outs[0], kv, meta)

        def backend_path(q, k, v, cache, out):
            return backend.forward(q, k, v, cache, meta, scale, out=out, rope=rope)

        def rope_kernel(q, k, v, cache, out, plan=plan):
            q, _ = rotary_write_kv_cache(rope.positions, q, k, v, rotary.cos_cache,
                                         rotary.sin_cache, cache, meta.slot_mapping)
            return paged_attention(q, cache, meta, scale, plan, out)

        def rope_in_launch(q, k, v, cache, out, plan=plan):
            return paged_attention(q, cache, meta, scale, plan, out, rope=rope, k=k, v=v)

        two_stages = dataclasses.replace(plan, num_stages=2)
        variants = {"projections only": None, "backend": (backend_path, {}),
                    "RoPE + KV-write kernel": (rope_kernel, {}),
                    "RoPE in the launch": (rope_in_launch, {}),
                    "merge kernel": (backend_path, {"MERGE_ROWS": 0}),
                    "RoPE kernel, merge kernel, two stages": (
                        functools.partial(rope_kernel, plan=two_stages), {"MERGE_ROWS": 0})}
        # the split's other shapes: balanced segments of BALANCED_SEGMENT_KEYS keys in 128- or
        # 64-key tiles (past the 4,096-key cap, or where contexts fill one: unsplit or crowded
        # plans), an even split in two (past the cap), no split (a crowded batch under it)
        keys = triton_attention.BALANCED_SEGMENT_KEYS
        balanced = 1 << (max(2, -(-cap // keys)) - 1).bit_length()
        even_under_cap = cap <= keys and plan.num_segments > 1 and plan.segment_tiles == 1
        shapes = {} if even_under_cap else {f"balanced, {t}-key tiles": dataclasses.replace(
            plan, tile=t, num_segments=balanced, segment_tiles=keys // t, num_stages=2)
            for t in (128, 64)}
        if cap > keys:
            shapes["even split in two"] = dataclasses.replace(
                plan, tile=64, num_segments=2, segment_tiles=1, num_stages=2)
        elif plan.segment_tiles > 1:
            shapes["unsplit"] = dataclasses.replace(plan, tile=64, num_segments=1,
                                                    segment_tiles=1, num_stages=2)
        for label, other in shapes.items():
            if other != plan:
                variants[label] = (functools.partial(rope_kernel, plan=other), {})
                variants[label + ", RoPE in the launch"] = (functools.partial(
                    rope_in_launch, plan=other), {})

        def layers_of(attend):
            def layer(i):
                qkv = linear(x, w_qkv[i], None)
                q = qkv[:, :hq * d].view(batch, hq, d)
                k = qkv[:, hq * d:(hq + hkv) * d].view(batch, hkv, d)
                v = qkv[:, (hq + hkv) * d:].view(batch, hkv, d)
                a = q if attend is None else attend(q, k, v, caches[i], outs[i])
                return linear(a.reshape(batch, -1), w_o[i], None)
            return [functools.partial(layer, i) for i in range(layers)]

        for label, variant in variants.items():
            attend, knobs = variant if variant else (None, {})
            saved = {key: getattr(triton_attention, key) for key in knobs}
            try:
                for key, value in knobs.items():
                    setattr(triton_attention, key, value)
                t = graph_ms(layers_of(attend) * 2)
                row = {"model": name, "batch": batch, "context": context, "cap": cap,
                       "variant": label, "us_per_layer": 1000 * t, "backend_plan": str(plan)}
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                row = {"model": name, "batch": batch, "variant": label, "error": str(e)[:300]}
            finally:
                for key, value in saved.items():
                    setattr(triton_attention, key, value)
            rows.append(row)
        del kv, caches, w_qkv, w_o
        torch.cuda.empty_cache()
    return rows


def copy_rate(dev) -> float:
    src = torch.ones(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = bench_ms(lambda: dst.copy_(src))
    return 2 * (1 << 30) / t / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--parts", default="prefill,decode,gemm")
    p.add_argument("--models", default="8b,32b")
    p.add_argument("--rows-m", default="2,4,8,16,24,32", help="rows: the M values")
    p.add_argument("--blas-m", default="1,4,32,128,8192", help="blas: the M values")
    p.add_argument("--other-module", help="versions: the triton_attention.py to compare with")
    p.add_argument("--json")
    args = p.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    parts = args.parts.split(",")
    result = {"copy_gbps": copy_rate(dev), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "prefill": [], "decode": [], "gemm": [],
              "balance": [], "layouts": [], "chunks": [], "dense": [], "builds": [], "blas": [],
              "prefetch": [], "versions": [], "gemv": [], "prologues": [], "rows": [],
              "chain": []}
    a = torch.randn(8192, 8192, device=dev, dtype=dtype)
    t = bench_ms(lambda: a @ a)
    result["matmul_tflops"] = 2 * 8192 ** 3 / t / 1e9
    del a
    print(f"copy {result['copy_gbps']:.0f} GB/s, matmul {result['matmul_tflops']:.0f} TFLOP/s, "
          f"cudnn {result['cudnn']}", flush=True)
    for name in args.models.split(","):
        s = SHAPES[name]
        if "prefill" in parts:
            for length in (8192, 32768):
                for r in prefill_attention(name, s, length, dev, dtype):
                    result["prefill"].append(r)
                    print("prefill", json.dumps(r), flush=True)
        if "decode" in parts and name == "8b":
            for batch, context in ((1, 4096), (4, 4096), (32, 4096), (128, 4096)):
                rows = decode_attention(name, s, batch, context, dev, dtype, result["copy_gbps"])
                result["decode"].extend(rows)
                for r in rows[:6] + [r for r in rows if r.get("current")]:
                    print("decode", json.dumps(r), flush=True)
        if "prefetch" in parts and name == "8b":
            for r in prefetch(name, s, dev, dtype):
                result["prefetch"].append(r)
                print("prefetch", json.dumps(r), flush=True)
        if "versions" in parts and name == "8b":
            for r in versions(name, s, dev, dtype, result["copy_gbps"], args.other_module):
                result["versions"].append(r)
                print("versions", json.dumps(r), flush=True)
        if "balance" in parts and name == "8b":
            for r in balance(name, s, dev, dtype, result["copy_gbps"]):
                result["balance"].append(r)
                print("balance", json.dumps(r), flush=True)
        for part, probe in (("chunks", chunks), ("builds", builds), ("dense", dense),
                            ("layouts", layouts), ("gemm", gemms),
                            ("blas", functools.partial(
                                blas, ms=[int(m) for m in args.blas_m.split(",")])),
                            ("gemv", gemvs), ("prologues", prologues), ("chain", chain),
                            ("rows", functools.partial(
                                rows_part, ms=[int(m) for m in args.rows_m.split(",")]))):
            if part in parts:
                for r in probe(name, s, dev, dtype):
                    result[part].append(r)
                    print(part, json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
