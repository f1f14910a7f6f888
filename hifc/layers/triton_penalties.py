"""vLLM's sampling penalties in one Triton pass over the logits.

Same result as the torch code in ``hifc.layers.sampling_ops.apply_penalties`` (which gathers
the penalty rows and makes ~10 passes over [R, V]): each program reads a block of one row's
logits, that request's counts and seen flags straight from the penalty pool, and writes the
penalized logits back. Imports without Triton; calling it then raises.
"""
from __future__ import annotations

import torch

from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton

BLOCK = 1024


@_jit
def _penalties_kernel(logits_ptr, logit_rows_ptr, pool_rows_ptr, counts_ptr, seen_ptr,
                      presence_ptr, frequency_ptr, repetition_ptr, vocab, stride_logits,
                      stride_pool, HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    if HAS_ROWS:
        row = tl.load(logit_rows_ptr + r).to(tl.int64)
    else:
        row = r.to(tl.int64)
    pool = tl.load(pool_rows_ptr + r).to(tl.int64)
    x = tl.load(logits_ptr + row * stride_logits + cols, mask=mask, other=0.0)
    count = tl.load(counts_ptr + pool * stride_pool + cols, mask=mask, other=0.0)
    seen = tl.load(seen_ptr + pool * stride_pool + cols, mask=mask, other=0)
    repetition = tl.load(repetition_ptr + r)
    scale = tl.where(seen != 0, repetition, 1.0)
    x = tl.where(x > 0, x / scale, x * scale)
    x = x - tl.load(frequency_ptr + r) * count
    x = x - tl.where(count > 0, tl.load(presence_ptr + r), 0.0)
    tl.store(logits_ptr + row * stride_logits + cols, x, mask=mask)


def triton_apply_penalties(logits: torch.Tensor, rows: torch.Tensor | None,
                           pool_rows: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor,
                           presence: torch.Tensor, frequency: torch.Tensor,
                           repetition: torch.Tensor) -> None:
    """In place on ``logits[rows]`` ([B, V] float32; rows [R] long, None: every row): request
    r's penalties ([R] float32 each) from pool row ``pool_rows[r]`` of counts ([N, V] float32)
    and seen ([N, V] bool)."""
    if triton is None:
        raise RuntimeError("triton_apply_penalties needs the triton package")
    num_rows, vocab = pool_rows.shape[0], logits.shape[1]
    if logits.stride(1) != 1 or counts.stride(1) != 1 or seen.stride(1) != 1 \
            or counts.stride(0) != seen.stride(0):
        raise ValueError("logits, counts and seen must be row-major with equal pool strides")
    grid = (num_rows, triton.cdiv(vocab, BLOCK))
    _penalties_kernel[grid](
        logits, pool_rows if rows is None else rows, pool_rows, counts, seen.view(torch.uint8),
        presence, frequency, repetition, vocab, logits.stride(0), counts.stride(0),
        HAS_ROWS=rows is not None, BLOCK=BLOCK, num_warps=4)
