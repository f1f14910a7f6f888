"""One-row projections (a batch-1 decode step's ``x W^T``) through a Triton GEMV.

At M = 1 a projection reads its whole weight for one output row, so it runs at the rate its
weight streams from memory. cuBLAS reads the 8B preset's smaller weights well below that rate;
this kernel gives each program BLOCK_N output rows, sums them over all of K in BLOCK_K slices in
float32 without tensor cores (three loads in flight), and adds the bias. 8B shapes on an H200,
each weight read from HBM (scripts/gpu_kernel_probe.py --parts gemv, docs/RESULTS.md), cuBLAS
against this kernel: QKV 17.5 / 14.2 us, O 13.2 / 10.1 us, down 31.1 / 28.5 us, gate-up 54.6 /
54.9 us.

Its float32 sums run in another order than cuBLAS's, so results differ from ``F.linear`` in the
last bits; every one-row projection on CUDA takes this path, whether in a CUDA graph or not.
Imports without Triton; ``usable`` then says False.
"""
from __future__ import annotations

import torch

from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton

BLOCK_N = 16
BLOCK_K = 512
NUM_STAGES = 3
NUM_WARPS = 4


@_jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, N, stride_wn, K_STEPS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 HAS_BIAS: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_k
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for _ in tl.range(0, K_STEPS, num_stages=STAGES):
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        acc += w.to(tl.float32) * tl.load(x_ptrs).to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=n_ok)


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True for one 16-bit row x ([1, K]) on CUDA against a weight ([N, K]) of its dtype,
    contiguous along K, with K a multiple of BLOCK_K."""
    return (triton is not None and x.is_cuda and x.dim() == 2 and x.shape[0] == 1
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and x.stride(-1) == 1 and weight.stride(-1) == 1 and x.shape[1] == weight.shape[1]
            and weight.shape[1] % BLOCK_K == 0)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         out: torch.Tensor | None = None, block_n: int = BLOCK_N, block_k: int = BLOCK_K,
         stages: int = NUM_STAGES, warps: int = NUM_WARPS) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs ``usable`` accepts -> [1, N] (into ``out`` if
    given); the launch configuration is the module's unless given (K a multiple of block_k)."""
    n, k = weight.shape
    if out is None:
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, weight if bias is None else bias, out, n, weight.stride(0),
        K_STEPS=k // block_k, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
        HAS_BIAS=bias is not None, num_warps=warps)
    return out
