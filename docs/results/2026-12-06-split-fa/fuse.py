"""Experimental: the O projection adding the residual and storing per-program sums of squares
(non-swap small-M kernel), and the gate-up projection normalizing its input from them (swap
small-M kernel): RMSNorm between them without a launch of its own."""
import torch
from hifc.layers import triton_pdl
from hifc.layers.triton_fused import norm_weighted, round_to
from hifc.layers.triton_gemv import rows_block_m, rows_config, PREFETCH_SLICES
from hifc.layers.triton_jit import tl, triton
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_pdl import enter, prefetch_rows


@_jit
def _add_sumsq_kernel(x_ptr, w_ptr, res_ptr, out_ptr, sumsq_ptr, M, N, stride_xm, stride_wn,
                      stride_om, K_STEPS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                      PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        prefetch_rows(w_ptr, offs_n, n_ok, stride_wn, PREFETCH_LINES)
        enter()
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, K_STEPS, num_stages=STAGES):
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    mask = m_ok[:, None] & n_ok[None, :]
    res = tl.load(res_ptr + offs_m[:, None] * stride_om + offs_n[None, :], mask=mask, other=0.0)
    s = (acc.to(dtype).to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], s, mask=mask)
    h = s.to(tl.float32)
    tl.store(sumsq_ptr + tl.program_id(0) * BLOCK_M + offs_m, tl.sum(h * h, axis=1))


@_jit
def _norm_sumsq_swap_kernel(x_ptr, w_ptr, g_ptr, sumsq_ptr, out_ptr, M, N, stride_xm,
                            stride_wn, stride_om, num_parts, eps,
                            K_STEPS: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                            PARTS: tl.constexpr, UNIT_OFFSET: tl.constexpr,
                            PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        prefetch_rows(w_ptr, offs_n, n_ok, stride_wn, PREFETCH_LINES)
        enter()
    K = K_STEPS * BLOCK_K
    p = tl.arange(0, PARTS)
    parts = tl.load(sumsq_ptr + p[:, None] * BLOCK_M + offs_m[None, :], mask=p[:, None] < num_parts,
                    other=0.0)
    inv = tl.math.rsqrt(tl.sum(parts, axis=0) / K + eps)  # [BLOCK_M]
    dtype = x_ptr.dtype.element_ty
    xt_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    g_ptrs = g_ptr + offs_k
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in tl.range(0, K_STEPS, num_stages=STAGES):
        xt = tl.load(xt_ptrs, mask=m_ok[None, :], other=0.0)
        g = tl.load(g_ptrs).to(tl.float32)
        xn = norm_weighted(xt.to(tl.float32) * inv[None, :], g[:, None], dtype, UNIT_OFFSET)
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        acc_t = tl.dot(w, xn.to(dtype), acc_t)
        xt_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None],
             acc_t.to(out_ptr.dtype.element_ty), mask=m_ok[None, :] & n_ok[:, None])


def add_sumsq(x, weight, residual):
    m, k = x.shape
    n = weight.shape[0]
    cfg = rows_config(n, m, triton_pdl.sm_count(x.device) if x.is_cuda else None)
    assert not cfg["swap"]
    bm = rows_block_m(m)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = triton.cdiv(n, cfg["block_n"])
    sumsq = torch.empty(grid, bm, dtype=torch.float32, device=x.device)
    _add_sumsq_kernel[(grid,)](
        x, weight, residual, out, sumsq, m, n, x.stride(0), weight.stride(0), out.stride(0),
        K_STEPS=k // cfg["block_k"], BLOCK_M=bm, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
        STAGES=cfg["stages"], PREFETCH_LINES=triton_pdl.prefetch_lines(
            k, weight.element_size(), PREFETCH_SLICES * cfg["block_k"]),
        **triton_pdl.launch_options(x.device), num_warps=cfg["warps"])
    return out, sumsq


def norm_sumsq(summed, sumsq, gamma, eps, unit_offset, weight):
    m, k = summed.shape
    n = weight.shape[0]
    cfg = rows_config(n, m, triton_pdl.sm_count(summed.device) if summed.is_cuda else None)
    assert cfg["swap"]
    bm = rows_block_m(m)
    out = torch.empty(m, n, dtype=summed.dtype, device=summed.device)
    parts = sumsq.shape[0]
    _norm_sumsq_swap_kernel[(triton.cdiv(n, cfg["block_n"]),)](
        summed, weight, gamma, sumsq, out, m, n, summed.stride(0), weight.stride(0),
        out.stride(0), parts, eps, K_STEPS=k // cfg["block_k"], BLOCK_M=bm,
        BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], STAGES=cfg["stages"],
        PARTS=triton.next_power_of_2(parts), UNIT_OFFSET=unit_offset,
        PREFETCH_LINES=triton_pdl.prefetch_lines(k, weight.element_size(),
                                                 PREFETCH_SLICES * cfg["block_k"]),
        **triton_pdl.launch_options(summed.device), num_warps=cfg["warps"],
        enable_fp_fusion=False)
    return out
