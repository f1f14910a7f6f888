"""Fused KV-cache write: one Triton launch scatters both K and V of the step's new tokens
(``triton_write_kv_cache``), or rotates q and k by RoPE as ``triton_fused.rotary`` does and
scatters the rotated K and V (``rotary_write_kv_cache``: one launch where there were two).

Same effect as ``hifc.layers.attention.write_kv_cache`` (two torch ``index_copy_`` launches),
except that a negative slot (a padding token) is skipped instead of rejected. Into a float8 cache
it writes x / scale (per KV head) clamped to +-448, rounded to nearest even as torch rounds.
Imports without Triton; calling it then raises.
"""
from __future__ import annotations

import torch

from hifc.dtypes import FP8_E4M3_MAX
from hifc.layers.attention import check_kv_scale
from hifc.layers import triton_pdl
from hifc.layers.triton_fused import rotate_heads, rotated_heads, rope_cos_sin, rope_operands
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton
from hifc.layers.triton_pdl import enter, enter_releasing_first


@_jit
def quantize(x, scale, FP8_MAX: tl.constexpr):
    """x / scale (float32, broadcast against x), clamped to float8's range, as float8."""
    scaled = tl.math.div_rn(x.to(tl.float32), scale)  # IEEE division, as torch's
    scaled = tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX)
    return scaled.to(tl.float8e4nv, fp_downcast_rounding="rtne")


@_jit
def _store_heads(x, cache_ptr, slot, scale_ptr, offs_h, offs_d, mask, stride_slot, stride_head,
                 NUM_KV_HEADS: tl.constexpr, KV_FP8: tl.constexpr, FP8_MAX: tl.constexpr):
    """x ([BLOCK_H, BLOCK_D]: heads offs_h, dims offs_d) into the cache at slot (float8: scaled
    per head)."""
    if KV_FP8:
        scale = tl.load(scale_ptr + offs_h, mask=offs_h < NUM_KV_HEADS, other=1.0)  # [BLOCK_H]
        x = quantize(x, scale[:, None], FP8_MAX)
    tl.store(cache_ptr + slot * stride_slot + offs_h[:, None] * stride_head + offs_d[None, :], x,
             mask=mask)


@_jit
def _kv_write_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     k_scale_ptr, v_scale_ptr,
                     stride_k_t, stride_k_h, stride_v_t, stride_v_h,
                     stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr, FP8_MAX: tl.constexpr,
                     PDL: tl.constexpr):
    if PDL:
        enter()
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :], mask=mask)
    _store_heads(k, k_cache_ptr, slot, k_scale_ptr, offs_h, offs_d, mask, stride_kc_slot,
                 stride_kc_head, NUM_KV_HEADS, KV_FP8, FP8_MAX)
    _store_heads(v, v_cache_ptr, slot, v_scale_ptr, offs_h, offs_d, mask, stride_vc_slot,
                 stride_vc_head, NUM_KV_HEADS, KV_FP8, FP8_MAX)


# The position and slot of a program's one token (and a float8 cache's scales) are scalar
# loads: not specialised on their pointers' 16-byte alignment, so that the rows after a step's
# leading decodes (an odd count of 64-bit entries in; the slot mapping also stands in for the
# scales of a 16-bit cache) run the variant the whole step's rows compiled.
@_jit(do_not_specialize_on_alignment=["positions_ptr", "slot_mapping_ptr", "k_scale_ptr",
                                      "v_scale_ptr"])
def _rotary_kv_write_kernel(positions_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, q_out_ptr,
                            k_out_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_scale_ptr,
                            v_scale_ptr, stride_cos, stride_q_t, stride_q_h, stride_k_t,
                            stride_k_h, stride_v_t, stride_v_h, stride_qo_t, stride_qo_h,
                            stride_ko_t, stride_ko_h, stride_kc_slot, stride_kc_head,
                            stride_vc_slot, stride_vc_head,
                            NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                            HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
                            BLOCK_HALF: tl.constexpr, BLOCK_D: tl.constexpr,
                            KV_FP8: tl.constexpr, FP8_MAX: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # a program per token: the attention after it launches (and prefetches) now
        enter_releasing_first()
    token = tl.program_id(0).to(tl.int64)
    cos, sin = rope_cos_sin(positions_ptr, cos_ptr, sin_ptr, token, stride_cos, HALF, BLOCK_HALF)
    rotate_heads(q_ptr + token * stride_q_t, q_out_ptr + token * stride_qo_t, cos, sin,
                 stride_q_h, stride_qo_h, NUM_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    k1, k2, mask = rotated_heads(k_ptr + token * stride_k_t, cos, sin, stride_k_h, NUM_KV_HEADS,
                                 HALF, BLOCK_HKV, BLOCK_HALF)
    offs_h = tl.arange(0, BLOCK_HKV)
    offs_d = tl.arange(0, BLOCK_HALF)
    k_out = k_out_ptr + token * stride_ko_t + offs_h[:, None] * stride_ko_h + offs_d[None, :]
    tl.store(k_out, k1, mask=mask)
    tl.store(k_out + HALF, k2, mask=mask)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    _store_heads(k1, k_cache_ptr, slot, k_scale_ptr, offs_h, offs_d, mask, stride_kc_slot,
                 stride_kc_head, NUM_KV_HEADS, KV_FP8, FP8_MAX)
    _store_heads(k2, k_cache_ptr + HALF, slot, k_scale_ptr, offs_h, offs_d, mask,
                 stride_kc_slot, stride_kc_head, NUM_KV_HEADS, KV_FP8, FP8_MAX)
    offs_v = tl.arange(0, BLOCK_D)
    v_mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_v[None, :] < 2 * HALF)
    v = tl.load(v_ptr + token * stride_v_t + offs_h[:, None] * stride_v_h + offs_v[None, :],
                mask=v_mask)
    _store_heads(v, v_cache_ptr, slot, v_scale_ptr, offs_h, offs_v, v_mask, stride_vc_slot,
                 stride_vc_head, NUM_KV_HEADS, KV_FP8, FP8_MAX)


def _cache_operands(kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    kv_scale: torch.Tensor | None):
    """The K and V caches as [slots, Hkv, D] views and their scales (the slot mapping where
    there are none: unused), checked."""
    check_kv_scale(kv_cache, kv_scale)
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if kv_cache[0].stride(1) != num_kv_heads * head_dim or kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache blocks must be contiguous [block_size, num_kv_heads, head_dim]")
    k_cache = kv_cache[0].view(-1, num_kv_heads, head_dim)  # [NB*BS, Hkv, D]
    v_cache = kv_cache[1].view(-1, num_kv_heads, head_dim)
    # [Hkv] each; without float8 unused (any tensor will do)
    scales = (kv_scale[0], kv_scale[1]) if kv_scale is not None else (slot_mapping, slot_mapping)
    return k_cache, v_cache, *scales


def triton_write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None) -> None:
    """Scatter new keys/values ([T, Hkv, D]) into cache ([2, NB, BS, Hkv, D]) slots; a float8
    cache needs kv_scale ([2, Hkv] float32: K and V scales)."""
    if triton is None:
        raise RuntimeError("triton_write_kv_cache needs the triton package (and a CUDA GPU)")
    k_cache, v_cache, k_scale, v_scale = _cache_operands(kv_cache, slot_mapping, kv_scale)
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    block_h = triton.next_power_of_2(num_kv_heads)
    block_d = triton.next_power_of_2(head_dim)
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d,
        KV_FP8=kv_scale is not None, FP8_MAX=FP8_E4M3_MAX,
        **triton_pdl.launch_options(k.device),
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )


def rotary_write_kv_cache(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                          kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                          kv_scale: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_fused.rotary`` of q and k, then ``triton_write_kv_cache`` of the rotated k and v,
    in one launch with the same results: returns the rotated q and k (new tensors)."""
    if triton is None:
        raise RuntimeError("rotary_write_kv_cache needs the triton package (and a CUDA GPU)")
    k_cache, v_cache, k_scale, v_scale = _cache_operands(kv_cache, slot_mapping, kv_scale)
    positions, q, k, q_out, k_out, meta = rope_operands(positions, q, k, cos_cache, sin_cache)
    if v.stride(-1) != 1:
        v = v.contiguous()
    num_tokens = q.shape[0]
    if num_tokens:
        _rotary_kv_write_kernel[(num_tokens,)](
            positions, cos_cache, sin_cache, q, k, v, q_out, k_out, k_cache, v_cache,
            slot_mapping, k_scale, v_scale, cos_cache.stride(0), q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), q_out.stride(0), q_out.stride(1),
            k_out.stride(0), k_out.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1),
            **meta, BLOCK_D=triton.next_power_of_2(kv_cache.shape[-1]),
            KV_FP8=kv_scale is not None, FP8_MAX=FP8_E4M3_MAX,
            **triton_pdl.launch_options(q.device), enable_fp_fusion=False)
    return q_out, k_out
