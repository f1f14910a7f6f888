"""Fused KV-cache write: one Triton launch scatters both K and V of the step's new tokens.

Same effect as ``hifc.layers.attention.write_kv_cache`` (two torch ``index_copy_`` launches),
except that a negative slot (a padding token) is skipped instead of rejected.
Imports without Triton; calling it then raises.
"""
from __future__ import annotations

import torch

from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton


@_jit
def _kv_write_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     stride_k_t, stride_k_h, stride_v_t, stride_v_h,
                     stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :], mask=mask)
    tl.store(k_cache_ptr + slot * stride_kc_slot + offs_h[:, None] * stride_kc_head + offs_d[None, :],
             k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_vc_slot + offs_h[:, None] * stride_vc_head + offs_d[None, :],
             v, mask=mask)


def triton_write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
    """Scatter new keys/values ([T, Hkv, D]) into cache ([2, NB, BS, Hkv, D]) slots."""
    if triton is None:
        raise RuntimeError("triton_write_kv_cache needs the triton package (and a CUDA GPU)")
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
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )
