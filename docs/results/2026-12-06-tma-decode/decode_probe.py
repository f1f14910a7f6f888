"""Decode attention with each 64-key K/V tile loaded by TMA, against hifc's paged kernel on the
same decode batches: python3 decode_probe.py OUT.json. 8B attention shapes (32 query heads, 8 KV
heads, head_dim 128), bf16, 64-token blocks in a shuffled cache, one new token per sequence
(rope=None on both sides: q rotated and K/V written before). The TMA kernel splits each context
into segments as the paged kernel's plan does and merges them in the last program of a
sequence's KV head (hifc's ``_merge_in_program``). Timed by triton's do_bench (L2 cleared
before each launch); NaN in every slot past a sequence's end."""
import json
import sys

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

from hifc.layers.attention import AttentionMetadata
from hifc.layers.triton_attention import (LOG2E, TritonAttentionBackend, _arrivals,
                                          _merge_in_program, _next_pow2, _segments,
                                          paged_attention)

HQ, HKV, D, BLOCK = 32, 8, 128, 64
dev = torch.device("cuda")
dtype = torch.bfloat16
torch.manual_seed(0)

# (name, context lengths)
CASES = {
    "32 x 1,024": [1024] * 32,
    "32 x 1,100": [1100] * 32,
    "32 x 1,025-1,152": [1025 + (i * 37) % 128 for i in range(32)],
    "32 x 4,096": [4096] * 32,
    "16 x 2,048": [2048] * 16,
    "1 x 4,096": [4096],
    "128 x 1,024": [1024] * 128,
}


@triton.jit
def _tile(q, m_i, l_i, acc, t, block_row, k_desc, v_desc, kv_col, seq_len, qk_scale,
          TILE: tl.constexpr, MASKED: tl.constexpr):
    blk = tl.load(block_row + t)
    k = k_desc.load([blk * TILE, kv_col])  # [TILE, D]
    v = v_desc.load([blk * TILE, kv_col])
    s = tl.dot(q, k.T) * qk_scale
    if MASKED:
        key_valid = t * TILE + tl.arange(0, TILE) < seq_len
        s = tl.where(key_valid[None, :], s, float("-inf"))
        v = tl.where(key_valid[:, None], v, 0.0)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _tma_decode_kernel(out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr, arrivals_ptr, q_ptr,
                       k_desc, v_desc, block_tables_ptr, seq_lens_ptr, qk_scale,
                       stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_bt,
                       NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                       HEAD_DIM: tl.constexpr, TILE: tl.constexpr, BLOCK_M: tl.constexpr,
                       NUM_SEGMENTS: tl.constexpr, SEGMENTS_PAD: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE)
    used = 1
    if NUM_SEGMENTS > 1:
        per, used = _segments(num_tiles, NUM_SEGMENTS, 1)
        if segment >= used:
            return
        tile_lo = segment * per
        tile_hi = tl.minimum(tile_lo + per, num_tiles)
        if segment == used - 1:
            tile_hi = num_tiles
    else:
        tile_lo = 0
        tile_hi = num_tiles
    full_hi = tl.maximum(tl.minimum(seq_len // TILE, tile_hi), tile_lo)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_valid = offs_m < GROUP
    head = kv_head * GROUP + offs_m
    block_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_col = kv_head * HEAD_DIM
    q = tl.load(q_ptr + seq * stride_q_t + head[:, None] * stride_q_h + offs_d[None, :],
                mask=row_valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for t in range(tile_lo, full_hi):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, t, block_row, k_desc, v_desc, kv_col, seq_len,
                              qk_scale, TILE, False)
    for t in range(full_hi, tile_hi):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, t, block_row, k_desc, v_desc, kv_col, seq_len,
                              qk_scale, TILE, True)
    if used == 1:
        out = acc / tl.where(row_valid, l_i, 1.0)[:, None]
        tl.store(out_ptr + seq * stride_o_t + head[:, None] * stride_o_h + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
    else:
        part = (seq * NUM_Q_HEADS + head) * NUM_SEGMENTS + segment
        tl.store(segm_max_ptr + part, m_i, mask=row_valid)
        tl.store(segm_sum_ptr + part, l_i, mask=row_valid)
        tl.store(segm_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None])
        tl.debug_barrier()
        arrivals = arrivals_ptr + seq * tl.num_programs(1) + kv_head
        if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == used - 1:
            tl.store(arrivals, 0)
            _merge_in_program(out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr, seq, kv_head,
                              used, stride_o_t, stride_o_h, NUM_Q_HEADS, GROUP, GROUP_PAD,
                              HEAD_DIM, HEAD_DIM, NUM_SEGMENTS, SEGMENTS_PAD)


def tma_decode(q, kv, meta, scale, segments, warps, stages, out, bufs):
    nb, bs, hkv, d = kv.shape[1:]
    group = q.shape[1] // hkv
    b = q.shape[0]
    k_desc = TensorDescriptor.from_tensor(kv[0].view(nb * bs, hkv * d), [bs, d])
    v_desc = TensorDescriptor.from_tensor(kv[1].view(nb * bs, hkv * d), [bs, d])
    segm_out, segm_max, segm_sum = bufs
    _tma_decode_kernel[(b, hkv, segments)](
        out, segm_out, segm_max, segm_sum, _arrivals(q.device, b * hkv), q, k_desc, v_desc,
        meta.block_tables, meta.seq_lens, scale * LOG2E, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), meta.block_tables.stride(0), NUM_Q_HEADS=q.shape[1],
        GROUP=group, GROUP_PAD=_next_pow2(group), HEAD_DIM=d, TILE=bs,
        BLOCK_M=max(16, _next_pow2(group)), NUM_SEGMENTS=segments,
        SEGMENTS_PAD=max(2, _next_pow2(segments)), num_warps=warps, num_stages=stages)
    return out


def case(seq_lens):
    blocks = [-(-s // BLOCK) for s in seq_lens]
    total = sum(blocks)
    kv = torch.randn(2, total + 1, BLOCK, HKV, D, device=dev, dtype=dtype)
    perm = torch.randperm(total) + 1
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    at = 0
    for i, nb in enumerate(blocks):
        tables[i, :nb] = perm[at:at + nb]
        at += nb
    b = len(seq_lens)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(b, dtype=torch.long, device=dev),
        query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev), query_start_loc_cpu=list(range(b + 1)),
        seq_lens_cpu=list(seq_lens), max_query_len=1, max_seq_len=max(seq_lens),
        block_size=BLOCK)
    qkv = torch.randn(b, (HQ + 2 * HKV) * D, device=dev, dtype=dtype)
    q = qkv[:, :HQ * D].view(-1, HQ, D)
    kv_bytes = sum(seq_lens) * HKV * D * 2 * 2
    return q, kv, meta, kv_bytes


def main(out_path):
    backend = TritonAttentionBackend()
    scale = D ** -0.5
    rows = []
    for name, lens in CASES.items():
        q, kv, meta, kv_bytes = case(lens)
        nan_cache = kv.clone()
        for i, n in enumerate(lens):
            last = meta.block_tables[i, (n - 1) // BLOCK].item()
            if n % BLOCK:
                nan_cache[:, last, n % BLOCK:] = float("nan")
        plan = backend.plan(q, kv, meta)
        out = torch.empty(q.shape, device=dev, dtype=dtype)
        ref = paged_attention(q, kv, meta, scale, plan, out).clone()
        base_ms = triton.testing.do_bench(lambda: paged_attention(q, kv, meta, scale, plan, out),
                                          warmup=20, rep=100)
        gbs = kv_bytes / base_ms / 1e6
        rows.append({"case": name, "variant": "paged", "plan": str(plan), "ms": base_ms,
                     "GB/s": gbs})
        print(f"\n{name}: paged {plan.num_segments} seg, tile {plan.tile}, "
              f"{plan.num_stages} st: {base_ms * 1e3:.1f} us ({gbs:.0f} GB/s)", flush=True)
        segs = sorted({max(1, plan.num_segments // 2), plan.num_segments,
                       min(64, plan.num_segments * 2)})
        b = len(lens)
        for segments in segs:
            bufs = (torch.empty(b, HQ, segments, D, device=dev, dtype=torch.float32),
                    torch.empty(b, HQ, segments, device=dev, dtype=torch.float32),
                    torch.empty(b, HQ, segments, device=dev, dtype=torch.float32))
            for warps, stages in ((4, 2), (4, 3), (4, 4), (8, 3)):
                label = f"tma {segments} seg {warps}w/{stages}s"
                row = {"case": name, "variant": label}
                try:
                    got = tma_decode(q, nan_cache, meta, scale, segments, warps, stages, out,
                                     bufs)
                    row["max_diff"] = (got.float() - ref.float()).abs().max().item()
                    row["nan"] = bool(got.isnan().any())
                    ms = triton.testing.do_bench(
                        lambda: tma_decode(q, kv, meta, scale, segments, warps, stages, out,
                                           bufs), warmup=20, rep=100)
                    row.update(ms=ms, **{"GB/s": kv_bytes / ms / 1e6})
                    print(f"  {label:>22} {ms * 1e3:8.1f} us {row['GB/s']:6.0f} GB/s "
                          f"x{ms / base_ms:.3f} diff {row['max_diff']:.2e} nan {row['nan']}",
                          flush=True)
                except Exception as e:  # noqa: BLE001
                    row["error"] = str(e)[:300]
                    print(f"  {label:>22} error {row['error']}", flush=True)
                rows.append(row)
        del q, kv, nan_cache, meta, out, ref
        torch.cuda.empty_cache()
    json.dump({"rows": rows, "device": torch.cuda.get_device_name()}, open(out_path, "w"),
              indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
