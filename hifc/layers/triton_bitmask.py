"""Grammar bitmasks applied to the logits in one Triton pass.

The torch code in ``hifc.layers.sampling_ops.apply_token_bitmask`` expands the [G, V/32] int32
words into [G, V] bits through several full-size temporaries, gathers the rows, masks and
scatters them back. Here each program reads one block of one row's words and writes -inf over
that row's forbidden logits, in place: on an H200, 64 rows of a 49,152-token vocabulary in 10
us of device time against 51, 256 rows of 128,256 tokens in 155 us against 495
(docs/RESULTS.md). Imports without Triton; calling it then raises.
"""
from __future__ import annotations

import torch

from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton

BLOCK = 2048  # logits per program (64 bitmask words)


@_jit
def _bitmask_kernel(logits_ptr, rows_ptr, bitmask_ptr, vocab, stride_logits, stride_bitmask,
                    BLOCK: tl.constexpr):
    g = tl.program_id(0)
    row = tl.load(rows_ptr + g).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    words = tl.load(bitmask_ptr + g.to(tl.int64) * stride_bitmask + cols // 32, mask=inside,
                    other=-1)
    forbidden = ((words >> (cols % 32)) & 1) == 0
    tl.store(logits_ptr + row * stride_logits + cols, float("-inf"), mask=inside & forbidden)


def triton_apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor,
                               bitmask: torch.Tensor) -> None:
    """In place: -inf over the tokens of ``logits[rows[g]]`` ([B, V] float32, rows [G] long)
    whose bit is 0 in ``bitmask[g]`` ([G, ceil(V/32)] int32, xgrammar's layout)."""
    num_rows, vocab = bitmask.shape[0], logits.shape[1]
    if logits.stride(1) != 1 or bitmask.stride(1) != 1 or bitmask.dtype != torch.int32:
        raise ValueError("logits and an int32 bitmask must be row-major")
    if bitmask.shape[1] * 32 < vocab or rows.shape[0] != num_rows:
        raise ValueError(f"a bitmask of {tuple(bitmask.shape)} does not cover {num_rows} rows "
                         f"of {vocab} tokens")
    if triton is None:
        raise RuntimeError("triton_apply_token_bitmask needs the triton package")
    if num_rows == 0:
        return
    _bitmask_kernel[(num_rows, triton.cdiv(vocab, BLOCK))](
        logits, rows, bitmask, vocab, logits.stride(0), bitmask.stride(0), BLOCK=BLOCK,
        num_warps=4)
