"""Swap-AB small-M kernel variants (the weight tile is the MMA's M side, so Hopper runs wgmma),
optionally split over K with a deterministic last-arriver reduction, loads through cp.async or
TMA descriptors."""
import torch
from hifc.layers.triton_jit import tl, triton
from hifc.layers.triton_pdl import enter, prefetch_rows


@triton.jit
def _finish(acc, out_ptr, ws_ptr, count_ptr, offs_m, offs_n, m_ok, n_ok, N, stride_om,
            BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    mask = m_ok[None, :] & n_ok[:, None]
    if SPLIT == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        ws = ws_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.store(ws + pid_k * BLOCK_M * N, acc, mask=n_ok[:, None])
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            tl.store(count_ptr + pid_n, 0)
            total = tl.load(ws, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
            for i in tl.static_range(1, SPLIT):
                total += tl.load(ws + i * BLOCK_M * N, mask=n_ok[:, None], other=0.0,
                                 cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rows_swap(x_ptr, w_ptr, out_ptr, ws_ptr, count_ptr, M, N, stride_xm, stride_wn, stride_om,
              K_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr,
              PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * (K_STEPS // SPLIT) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        prefetch_rows(w_ptr + k0, offs_n, n_ok, stride_wn, PREFETCH_LINES)
        enter()
    xt_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in tl.range(0, K_STEPS // SPLIT, num_stages=STAGES):
        xt = tl.load(xt_ptrs, mask=m_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(w, xt, acc)
        xt_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _finish(acc, out_ptr, ws_ptr, count_ptr, offs_m, offs_n, m_ok, n_ok, N, stride_om,
            BLOCK_M, SPLIT)


@triton.jit
def rows_swap_tma(x_desc, w_desc, w_ptr, out_ptr, ws_ptr, count_ptr, M, N, stride_wn, stride_om,
                  K_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr,
                  PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    step0 = tl.program_id(1) * (K_STEPS // SPLIT)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        prefetch_rows(w_ptr + step0 * BLOCK_K, offs_n, n_ok, stride_wn, PREFETCH_LINES)
        enter()
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.range(0, K_STEPS // SPLIT, num_stages=STAGES):
        k = (step0 + step) * BLOCK_K
        w = w_desc.load([n0, k])
        x = x_desc.load([0, k])
        acc = tl.dot(w, tl.trans(x), acc)
    _finish(acc, out_ptr, ws_ptr, count_ptr, offs_m, offs_n, m_ok, n_ok, N, stride_om,
            BLOCK_M, SPLIT)


_scratch: dict = {}


def scratch(device, n, block_n, block_m, split):
    key = (device, n, block_n, block_m, split)
    if key not in _scratch:
        _scratch[key] = (torch.empty(max(split, 1) * block_m * n, dtype=torch.float32,
                                     device=device),
                         torch.zeros(triton.cdiv(n, block_n), dtype=torch.int32, device=device))
    return _scratch[key]


def swap_rows(x, weight, bias=None, *, out=None, block_n, block_k, stages, warps, split=1,
              tma=False, pdl=True):
    assert bias is None
    m, k = x.shape
    n = weight.shape[0]
    block_m = 16 if m <= 16 else 32
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ws, count = scratch(x.device, n, block_n, block_m, split)
    grid = (triton.cdiv(n, block_n), split)
    lines = max(1, min(16, block_k * 2 // 128))
    pdl_kw = dict(PDL=True, launch_pdl=True) if pdl else dict(PDL=False)
    common = dict(K_STEPS=k // block_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  STAGES=stages, SPLIT=split, PREFETCH_LINES=lines, num_warps=warps, **pdl_kw)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [block_m, block_k])
        w_desc = TensorDescriptor(weight, list(weight.shape), list(weight.stride()),
                                  [block_n, block_k])
        rows_swap_tma[grid](x_desc, w_desc, weight, out, ws, count, m, n, weight.stride(0),
                            out.stride(0), **common)
    else:
        rows_swap[grid](x, weight, out, ws, count, m, n, x.stride(0), weight.stride(0),
                        out.stride(0), **common)
    return out
