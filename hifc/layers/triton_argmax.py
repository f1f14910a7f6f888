"""Greedy token choice: the first maximum of each row of the logits, in two short Triton
launches.

torch's ``argmax`` over a [B, V] float32 row of a 128k vocabulary runs in ~27 us on an H200
whatever B (a few blocks per row; docs/RESULTS.md): at small decode batches that is a visible
part of a step. Here programs of CHUNK columns each write their chunk's maximum and its first
index, and one program per row takes the first chunk holding the row's maximum. NaN counts as
infinite (torch counts it larger still: a row with +inf before its first NaN is the one row
where the two differ). Imports without Triton; calling it then raises.
"""
from __future__ import annotations

import torch

from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton

CHUNK = 4096  # columns per program of the first launch
MAX_CHUNKS = 64  # chunks per row the second launch takes (V up to 262,144)


@_jit
def _chunk_max_kernel(logits_ptr, max_ptr, idx_ptr, vocab, stride_row,
                      NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab,
                other=float("-inf")).to(tl.float32)  # exact from 16-bit floats
    x = tl.where(x != x, float("inf"), x)  # NaN first, as torch.argmax
    best = tl.max(x, axis=0)
    first = tl.min(tl.where(x == best, cols, vocab), axis=0)  # past the row if none
    tl.store(max_ptr + row * NUM_CHUNKS + chunk, best)
    tl.store(idx_ptr + row * NUM_CHUNKS + chunk, first)


@_jit
def _row_argmax_kernel(max_ptr, idx_ptr, out_ptr, NUM_CHUNKS: tl.constexpr,
                       CHUNKS_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNKS_PAD)
    valid = offs < NUM_CHUNKS
    best = tl.load(max_ptr + row * NUM_CHUNKS + offs, mask=valid, other=float("-inf"))
    idx = tl.load(idx_ptr + row * NUM_CHUNKS + offs, mask=valid, other=2**31 - 1)
    top = tl.max(best, axis=0)
    # chunks hold increasing columns, so the smallest index among the maxima is the first
    tl.store(out_ptr + row, tl.min(tl.where(best == top, idx, 2**31 - 1), axis=0).to(tl.int64))


DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fits(logits: torch.Tensor) -> bool:
    return (logits.dim() == 2 and logits.dtype in DTYPES and logits.stride(1) == 1
            and 0 < logits.shape[1] <= MAX_CHUNKS * CHUNK)


def usable(logits: torch.Tensor) -> bool:
    """Whether the sampler takes ``argmax_rows`` for these logits: float32, bfloat16 or float16
    [B, V] on CUDA with Triton, V within MAX_CHUNKS x CHUNK, rows contiguous."""
    return triton is not None and logits.is_cuda and _fits(logits)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` (int64 [B]) of [B, V] logits (``DTYPES``) with contiguous
    rows."""
    if triton is None:
        raise RuntimeError("argmax_rows needs the triton package")
    if not _fits(logits):
        raise ValueError("argmax_rows takes float32/bfloat16/float16 [B, V] logits with "
                         f"contiguous rows and 0 < V <= {MAX_CHUNKS * CHUNK}, got {logits.dtype} "
                         f"{tuple(logits.shape)}")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    chunks = triton.cdiv(vocab, CHUNK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    _chunk_max_kernel[(rows, chunks)](logits, best, idx, vocab, logits.stride(0),
                                      NUM_CHUNKS=chunks, CHUNK=CHUNK, num_warps=8)
    _row_argmax_kernel[(rows,)](best, idx, out, NUM_CHUNKS=chunks,
                                CHUNKS_PAD=max(2, triton.next_power_of_2(chunks)), num_warps=1)
    return out
