"""Fused KV-cache write: one Triton launch scatters both K and V of the step's new tokens.

Same effect as ``hifc.layers.attention.write_kv_cache`` (two torch ``index_copy_`` launches),
except that a negative slot (a padding token) is skipped instead of rejected. Into a float8 cache
it writes x / scale (per KV head) clamped to +-448, rounded to nearest even as torch rounds.
Imports without Triton; calling it then raises.
"""
from __future__ import annotations

import torch

from hifc.dtypes import FP8_E4M3_MAX
from hifc.layers.attention import check_kv_scale
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton


@_jit
def _quantize(x, scale_ptr, offs_h, NUM_KV_HEADS: tl.constexpr, FP8_MAX: tl.constexpr):
    """x ([BLOCK_H, BLOCK_D]) / its head's scale, clamped to float8's range, as float8."""
    scale = tl.load(scale_ptr + offs_h, mask=offs_h < NUM_KV_HEADS, other=1.0)  # [BLOCK_H]
    scaled = tl.math.div_rn(x.to(tl.float32), scale[:, None])  # IEEE division, as torch's
    scaled = tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX)
    return scaled.to(tl.float8e4nv, fp_downcast_rounding="rtne")


@_jit
def _kv_write_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     k_scale_ptr, v_scale_ptr,
                     stride_k_t, stride_k_h, stride_v_t, stride_v_h,
                     stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr, FP8_MAX: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :], mask=mask)
    if KV_FP8:
        k = _quantize(k, k_scale_ptr, offs_h, NUM_KV_HEADS, FP8_MAX)
        v = _quantize(v, v_scale_ptr, offs_h, NUM_KV_HEADS, FP8_MAX)
    tl.store(k_cache_ptr + slot * stride_kc_slot + offs_h[:, None] * stride_kc_head + offs_d[None, :],
             k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_vc_slot + offs_h[:, None] * stride_vc_head + offs_d[None, :],
             v, mask=mask)


def triton_write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None) -> None:
    """Scatter new keys/values ([T, Hkv, D]) into cache ([2, NB, BS, Hkv, D]) slots; a float8
    cache needs kv_scale ([2, Hkv] float32: K and V scales)."""
    if triton is None:
        raise RuntimeError("triton_write_kv_cache needs the triton package (and a CUDA GPU)")
    check_kv_scale(kv_cache, kv_scale)
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if kv_cache[0].stride(1) != num_kv_heads * head_dim or kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache blocks must be contiguous [block_size, num_kv_heads, head_dim]")
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    k_cache = kv_cache[0].view(-1, num_kv_heads, head_dim)  # [NB*BS, Hkv, D]
    v_cache = kv_cache[1].view(-1, num_kv_heads, head_dim)
    block_h = triton.next_power_of_2(num_kv_heads)
    block_d = triton.next_power_of_2(head_dim)
    fp8 = kv_scale is not None
    # [Hkv] each; without float8 unused (any tensor will do)
    k_scale, v_scale = (kv_scale[0], kv_scale[1]) if fp8 else (slot_mapping, slot_mapping)
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d,
        KV_FP8=fp8, FP8_MAX=FP8_E4M3_MAX,
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )
