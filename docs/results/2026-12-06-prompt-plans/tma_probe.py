"""A paged prompt-attention kernel that loads each 64-token K/V block by TMA (a tensor
descriptor over the cache), against hifc's paged kernel on the same chunks:
python3 tma_probe.py OUT.json. Prompt chunks only (no window, soft-capping, float8 or split),
16-bit cache, tile = the cache's block (64 tokens). Cases, shapes and timing as probe.py."""
import itertools
import json
import sys

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe import BLOCK, CASES, D, HKV, HQ, case  # noqa: E402

from hifc.layers.triton_attention import (LOG2E, TritonAttentionBackend,  # noqa: E402
                                          _find_seq_idx, paged_attention)


@triton.jit
def _tile(q, m_i, l_i, acc, t, block_row, k_desc, v_desc, kv_head, kv_end, last_key, qk_scale,
          HEAD_DIM: tl.constexpr, TILE: tl.constexpr, MASKED: tl.constexpr):
    blk = tl.load(block_row + t)
    k = k_desc.load([blk * TILE, kv_head * HEAD_DIM])  # [TILE, D]
    v = v_desc.load([blk * TILE, kv_head * HEAD_DIM])
    s = tl.dot(q, k.T) * qk_scale
    if MASKED:
        key_pos = t * TILE + tl.arange(0, TILE)
        key_valid = key_pos < kv_end
        s = tl.where((key_pos[None, :] <= last_key[:, None]) & key_valid[None, :], s,
                     float("-inf"))
        v = tl.where(key_valid[:, None], v, 0.0)  # slots past the sequence: any bits
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _tma_prompt_kernel(out_ptr, q_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr,
                       query_start_loc_ptr, qk_scale, num_seqs, stride_q_t, stride_q_h,
                       stride_o_t, stride_o_h, stride_bt,
                       GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr):
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_local = q_block - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_pos = q_block_local * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_valid = q_pos < q_len
    token = (q_start + q_pos).to(tl.int64)
    last_key = context_len + q_pos
    first_q_pos = q_block_local * BLOCK_Q
    kv_end = tl.minimum(seq_len, context_len + first_q_pos + BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE)
    full_hi = (context_len + first_q_pos + 1) // TILE
    block_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    q = tl.load(q_ptr + token[:, None] * stride_q_t + head[:, None] * stride_q_h
                + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for t in range(0, full_hi):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, t, block_row, k_desc, v_desc, kv_head, kv_end,
                              last_key, qk_scale, HEAD_DIM, TILE, False)
    for t in range(full_hi, num_tiles):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, t, block_row, k_desc, v_desc, kv_head, kv_end,
                              last_key, qk_scale, HEAD_DIM, TILE, True)
    out = acc / tl.where(row_valid, l_i, 1.0)[:, None]
    tl.store(out_ptr + token[:, None] * stride_o_t + head[:, None] * stride_o_h + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def tma_attention(q, kv, meta, scale, block_m, warps, stages, out):
    nb, bs, hkv, d = kv.shape[1:]
    group = q.shape[1] // hkv
    block_q = block_m // group
    k_desc = TensorDescriptor.from_tensor(kv[0].view(nb * bs, hkv * d), [bs, d])
    v_desc = TensorDescriptor.from_tensor(kv[1].view(nb * bs, hkv * d), [bs, d])
    grid = (q.shape[0] // block_q + meta.num_seqs, hkv)
    _tma_prompt_kernel[grid](out, q, k_desc, v_desc, meta.block_tables, meta.seq_lens,
                             meta.query_start_loc, scale * LOG2E, meta.num_seqs,
                             q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                             meta.block_tables.stride(0), GROUP=group, HEAD_DIM=d, TILE=bs,
                             BLOCK_M=block_m, BLOCK_Q=block_q, num_warps=warps,
                             num_stages=stages)
    return out


def main(out_path):
    assert BLOCK == 64
    backend = TritonAttentionBackend(dense_prefill=False)
    scale = D ** -0.5
    rows = []
    for name, spec in CASES.items():
        q, kv, meta, flops = case(spec)
        # slots past each sequence's end hold NaN: a kernel that lets them in fails the check
        nan_cache = kv.clone()
        for i, n in enumerate(meta.seq_lens_cpu):
            last = meta.block_tables[i, (n - 1) // BLOCK].item()
            nan_cache[:, last, n % BLOCK or BLOCK:] = float("nan")
        base = backend.plan(q, kv, meta)
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        ref = paged_attention(q, kv, meta, scale, base, out).clone()
        base_ms = triton.testing.do_bench(lambda: paged_attention(q, kv, meta, scale, base, out),
                                          warmup=10, rep=60)
        rows.append({"case": name, "variant": "paged backend", "ms": base_ms,
                     "tflops": flops / base_ms / 1e9})
        print(f"\n{name}: paged backend {base_ms * 1e3:.1f} us ({flops / base_ms / 1e9:.0f} TFLOP/s)")
        for bm, warps, stages in itertools.product((64, 128), (4, 8), (2, 3, 4)):
            label = f"tma {bm}/{warps}w/{stages}s"
            row = {"case": name, "variant": label}
            try:
                got = tma_attention(q, nan_cache, meta, scale, bm, warps, stages, out)
                row["max_diff"] = (got.float() - ref.float()).abs().max().item()
                row["nan"] = bool(got.isnan().any())
                ms = triton.testing.do_bench(
                    lambda: tma_attention(q, kv, meta, scale, bm, warps, stages, out),
                    warmup=10, rep=60)
                row.update(ms=ms, tflops=flops / ms / 1e9)
                print(f"  {label:>16} {ms * 1e3:8.1f} us {row['tflops']:6.0f} TFLOP/s "
                      f"x{ms / base_ms:.3f} diff {row['max_diff']:.2e} nan {row['nan']}")
            except Exception as e:  # noqa: BLE001
                row["error"] = str(e)[:200]
                print(f"  {label:>16} error {row['error']}")
            rows.append(row)
        del q, kv, nan_cache, meta, out, ref
        torch.cuda.empty_cache()
    json.dump({"rows": rows, "device": torch.cuda.get_device_name()}, open(out_path, "w"),
              indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
