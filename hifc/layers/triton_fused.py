"""Fused Triton kernels for the decoder's elementwise work: (residual add +) RMSNorm, SiLU-and-mul,
and rotary embedding of q and k. Each replaces a chain of small torch kernels with one launch.

They reproduce the torch code in norm.py, activation.py and rotary.py rounding step by step: math
in float32, rounded to the model dtype exactly where torch rounds (torch computes each bf16/fp16
op in float32 and rounds its result). Kernels are compiled with ``enable_fp_fusion=False`` so that
no multiply-add is contracted into an FMA, which torch's separate kernels never do, and SiLU
uses CUDA's expf and IEEE division as torch's kernel does. What remains different: RMSNorm sums
its squares in another order than torch's mean, and under Triton's interpreter (CPU tests) exp
is numpy's; tests/layers/test_triton_fused.py states the bounds.

Grids depend only on tensor shapes and nothing syncs with the host, so the kernels can be
captured in CUDA graphs. Imports without Triton; ``usable`` then says False.
"""
from __future__ import annotations

import torch

from hifc.layers import triton_pdl
from hifc.layers.triton_jit import interpreting, tl, triton
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_pdl import enter_releasing_first

if triton is not None:
    from triton.language.extra import libdevice
else:  # CPU-only install: the module imports, the torch code runs instead
    libdevice = None


def usable(*tensors: torch.Tensor) -> bool:
    """True if Triton is installed and every tensor is on a CUDA device."""
    return triton is not None and all(t.is_cuda for t in tensors)


@_jit
def round_to(x, dtype: tl.constexpr):
    """float32 x rounded to dtype and back: the value torch stores after a dtype op."""
    return x.to(dtype).to(tl.float32)


@_jit
def norm_weighted(h, weight, dtype: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """RMSNorm's last step in float32, before its final rounding to dtype: h (x / rms(x)) scaled
    by the norm weight, as Llama (h rounded to dtype first) or Gemma ((1 + weight) * h) does."""
    if UNIT_OFFSET:
        return (1.0 + weight) * h
    return weight * round_to(h, dtype)


@_jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, summed_ptr,
                     stride_x, stride_residual, stride_out, stride_summed, eps,
                     HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                     UNIT_OFFSET: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        enter_releasing_first()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(dtype)
        tl.store(summed_ptr + row * stride_summed + offs, x, mask=mask)
    h = x.to(tl.float32)
    variance = tl.sum(h * h, axis=0) / HIDDEN
    h = h * tl.math.rsqrt(variance + eps)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    out = norm_weighted(h, weight, dtype, UNIT_OFFSET)
    tl.store(out_ptr + row * stride_out + offs, out.to(dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None,
             unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm.forward in one launch: x, residual [T, H], weight [H] (all one dtype).

    Returns ``(weight * norm(s), s)`` with ``s = x + residual`` (or x itself); with unit_offset
    ``(1 + weight) * norm(s)``."""
    if weight.dtype != x.dtype or (residual is not None and residual.dtype != x.dtype):
        raise ValueError("rms_norm needs x, residual and weight of one dtype")
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, hidden)
    if residual is None:
        residual2, summed, summed2 = x2, x, x2  # unused by the kernel
    else:
        residual2 = residual.reshape(-1, hidden)
        if residual2.stride(-1) != 1:
            residual2 = residual2.contiguous()
        summed = torch.empty_like(out)
        summed2 = summed.view(-1, hidden)
    num_rows = x2.shape[0]
    if num_rows:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(num_rows,)](
            x2, residual2, weight, out2, summed2,
            x2.stride(0), residual2.stride(0), out2.stride(0), summed2.stride(0), eps,
            HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None,
            UNIT_OFFSET=unit_offset, **triton_pdl.launch_options(x.device),
            num_warps=max(1, min(block // 256, 16)), enable_fp_fusion=False)
    return out, summed


@_jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out,
                         INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr,
                         PRECISE_EXP: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        enter_releasing_first()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTERMEDIATE
    gate = tl.load(gate_up_ptr + row * stride_in + offs, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + INTERMEDIATE + offs, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    if PRECISE_EXP:  # CUDA's expf and IEEE division, as torch's silu kernel computes it
        silu = tl.math.div_rn(g, 1.0 + libdevice.exp(-g))
    else:  # the interpreter has no libdevice
        silu = g / (1.0 + tl.exp(-g))
    out = round_to(silu, dtype) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, out.to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for gate_up = [gate | up] ([T, 2I]) in one launch; returns [T, I]."""
    intermediate = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * intermediate)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(*gate_up.shape[:-1], intermediate, dtype=gate_up.dtype,
                      device=gate_up.device)
    out2 = out.view(-1, intermediate)
    if x.shape[0] and intermediate:
        block = min(triton.next_power_of_2(intermediate), 1024)
        grid = (x.shape[0], triton.cdiv(intermediate, block))
        _silu_and_mul_kernel[grid](
            x, out2, x.stride(0), out2.stride(0), INTERMEDIATE=intermediate, BLOCK=block,
            PRECISE_EXP=gate_up.is_cuda and not interpreting(),
            **triton_pdl.launch_options(gate_up.device), num_warps=4,
            enable_fp_fusion=False)
    return out


@_jit
def rotated_heads(x_ptr, cos, sin, stride_x_head, NUM_HEADS: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate-half RoPE of one token's heads ([NUM_HEADS, 2 * HALF]); cos, sin: [BLOCK_HALF].
    Returns both halves ([BLOCK_H, BLOCK_HALF] each, in x's dtype) and their mask."""
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (offs_h < NUM_HEADS) & (offs_d < HALF)
    x_ptrs = x_ptr + offs_h * stride_x_head + offs_d
    x1 = tl.load(x_ptrs, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(x_ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    cos = cos[None, :]
    sin = sin[None, :]
    out1 = round_to(x1 * cos, dtype) - round_to(x2 * sin, dtype)
    out2 = round_to(x2 * cos, dtype) + round_to(x1 * sin, dtype)
    return out1.to(dtype), out2.to(dtype), mask


@_jit
def rotate_heads(x_ptr, out_ptr, cos, sin, stride_x_head, stride_out_head,
                 NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_HALF: tl.constexpr):
    """``rotated_heads`` of x stored into out (same layout, its own head stride)."""
    out1, out2, mask = rotated_heads(x_ptr, cos, sin, stride_x_head, NUM_HEADS, HALF, BLOCK_H,
                                     BLOCK_HALF)
    out_ptrs = (out_ptr + tl.arange(0, BLOCK_H)[:, None] * stride_out_head
                + tl.arange(0, BLOCK_HALF)[None, :])
    tl.store(out_ptrs, out1, mask=mask)
    tl.store(out_ptrs + HALF, out2, mask=mask)


@_jit
def rope_cos_sin(positions_ptr, cos_ptr, sin_ptr, token, stride_cache, HALF: tl.constexpr,
                 BLOCK_HALF: tl.constexpr):
    """cos and sin ([BLOCK_HALF], float32) of the token's position."""
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos = tl.load(cos_ptr + pos * stride_cache + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_cache + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    return cos, sin


@_jit
def _rotary_kernel(positions_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr,
                   stride_cache, stride_q_token, stride_q_head, stride_k_token, stride_k_head,
                   stride_q_out_token, stride_q_out_head, stride_k_out_token, stride_k_out_head,
                   NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = rope_cos_sin(positions_ptr, cos_ptr, sin_ptr, token, stride_cache, HALF,
                            BLOCK_HALF)
    rotate_heads(q_ptr + token * stride_q_token, q_out_ptr + token * stride_q_out_token, cos, sin,
                 stride_q_head, stride_q_out_head, NUM_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    rotate_heads(k_ptr + token * stride_k_token, k_out_ptr + token * stride_k_out_token, cos, sin,
                 stride_k_head, stride_k_out_head, NUM_KV_HEADS, HALF, BLOCK_HKV, BLOCK_HALF)


def rope_operands(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  cos_cache: torch.Tensor, sin_cache: torch.Tensor):
    """What a kernel that rotates q and k as ``rotary`` does takes: (positions, q, k) with
    contiguous last dims, new q_out and k_out, and its constexpr arguments and warps (a dict)."""
    num_tokens, num_q_heads, head_dim = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if cos_cache.stride(-1) != 1 or cos_cache.stride() != sin_cache.stride():
        raise ValueError("cos_cache and sin_cache must be alike with a contiguous last dim")
    if positions.stride(0) != 1:
        positions = positions.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    block_hq = triton.next_power_of_2(num_q_heads)
    block_half = triton.next_power_of_2(head_dim // 2)
    meta = dict(NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=k.shape[1], HALF=head_dim // 2,
                BLOCK_HQ=block_hq, BLOCK_HKV=triton.next_power_of_2(k.shape[1]),
                BLOCK_HALF=block_half, num_warps=4 if block_hq * block_half <= 2048 else 8)
    return positions, q, k, q_out, k_out, meta


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor,
           sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RotaryEmbedding.forward in one launch. q [T, Hq, D], k [T, Hkv, D] may be strided views
    (of one qkv tensor, say) with a contiguous last dim; cos/sin_cache [P, D/2] in q's dtype;
    positions [T] of any integer dtype. Returns new contiguous q, k; the inputs are left as they
    are."""
    positions, q, k, q_out, k_out, meta = rope_operands(positions, q, k, cos_cache, sin_cache)
    if q.shape[0]:
        _rotary_kernel[(q.shape[0],)](
            positions, cos_cache, sin_cache, q, k, q_out, k_out, cos_cache.stride(0),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            **meta, enable_fp_fusion=False)
    return q_out, k_out
