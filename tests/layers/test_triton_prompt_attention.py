"""The TMA prompt-attention kernel (hifc.layers.triton_prompt_attention) against the torch
reference, and which chunks the paged kernel hands to it.

Runs on a CUDA GPU of compute capability 9.0 or more. Without one, set TRITON_INTERPRET=1 (with
triton installed) to run the cases on the CPU through Triton's interpreter
(tests/test_triton_interpreter.py runs them in a child pytest).
"""
from __future__ import annotations

import math
import os
from unittest import mock

import pytest
import torch

from hifc.layers import triton_prompt_attention
from hifc.layers.attention import reference_paged_attention, write_kv_cache
from hifc.layers.triton_attention import TritonAttentionBackend
from hifc.layers.triton_prompt_attention import fits, prompt_attention
from tests.fixtures import paged_metadata
from tests.layers.test_triton_attention import make_step as make_attention_step

try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
    DEVICE = "cuda"
elif INTERPRET:
    DEVICE = "cpu"
else:
    DEVICE = None
_needs_device = pytest.mark.skipif(
    DEVICE is None or not HAS_TRITON,
    reason="needs a CUDA GPU with TMA and triton (or TRITON_INTERPRET=1)")


def device_test(fn):
    return pytest.mark.gpu(_needs_device(fn))


TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = [torch.float16] if DEVICE == "cpu" else [torch.float16, torch.bfloat16]  # interpreter:
# bf16 tl.dot is wrong there

# a fresh chunk longer than a q block, a decode, a chunk over cached context ending mid-tile,
# a short fresh chunk, and one over a context of whole tiles
QUERY = [150, 1, 70, 9, 64]
CONTEXT = [0, 200, 130, 0, 128]


def make_step(num_q_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
    """test_triton_attention's step over QUERY / CONTEXT with the new tokens' K/V written to the
    cache (as the backend writes them before it attends), and NaN in the slots past each
    sequence's end: a kernel that lets them into its output fails."""
    q, k, v, kv_cache, meta = make_attention_step(QUERY, CONTEXT, num_q_heads, num_kv_heads,
                                                  head_dim, block_size, dtype, seed)
    write_kv_cache(k, v, kv_cache, meta.slot_mapping)
    for i, length in enumerate(meta.seq_lens_cpu):
        last = meta.block_tables[i, (length - 1) // block_size]
        kv_cache[:, last, (length - 1) % block_size + 1:] = float("nan")
    return q, k, v, kv_cache, meta


def relative_error(out, q, kv_cache, meta, scale):
    ref = reference_paged_attention(q.float(), torch.nan_to_num(kv_cache.float()), meta, scale)
    assert not torch.isnan(out).any()
    return ((out.float() - ref).norm() / ref.norm()).item()


@device_test
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", [
    (8, 2, 64),    # group 4
    (10, 2, 128),  # group 5: 125 of a q block's 128 rows used
    (2, 2, 32),    # no grouping
])
def test_matches_reference(num_q_heads, num_kv_heads, head_dim, block_size, dtype):
    q, _, _, kv_cache, meta = make_step(num_q_heads, num_kv_heads, head_dim, block_size, dtype)
    scale = 1 / math.sqrt(head_dim)
    assert fits(q, kv_cache, block_size, None, None)
    out = torch.full_like(q, float("nan"))  # every element must be written
    assert prompt_attention(q, kv_cache, meta, scale, out) is out
    assert relative_error(out, q, kv_cache, meta, scale) < TOLERANCE[dtype]


def test_fits_what_the_kernel_takes():
    q = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 4, 64, 2, 128, dtype=torch.bfloat16)
    assert fits(q, cache, 64, None, None)
    assert fits(q, torch.zeros(2, 4, 128, 2, 128, dtype=torch.bfloat16), 128, None, None)
    assert not fits(q, cache, 64, 4096, None)  # a sliding window
    assert not fits(q, cache, 64, None, 30.0)  # soft-capping
    assert not fits(q, cache.to(torch.float8_e4m3fn), 64, None, None)
    assert not fits(q.float(), cache.float(), 64, None, None)
    assert not fits(q, torch.zeros(2, 4, 32, 2, 128, dtype=torch.bfloat16), 32, None, None)
    for head_dim in (80, 256):
        assert not fits(torch.zeros(3, 8, head_dim, dtype=torch.bfloat16),
                        torch.zeros(2, 4, 64, 2, head_dim, dtype=torch.bfloat16), 64, None, None)
    layers = torch.zeros(2, 4, 64, 4, 128, dtype=torch.bfloat16)
    assert not fits(q, layers[:, :, :, :2], 64, None, None)  # not contiguous per layer
    assert not triton_prompt_attention.takes(q, cache, 64, None, None)  # not on a GPU


@device_test
def test_paged_attention_hands_it_whole_q_block_chunks():
    """Through the backend: a step with a chunk of a whole 128-row q block goes to the kernel
    (once), a decode-only step and a step of short chunks do not; outputs match the
    reference either way."""
    dtype = torch.float16
    backend = TritonAttentionBackend(dense_prefill=False)
    calls = []

    def spy(*args):
        calls.append(args[2].num_seqs)
        return prompt_attention(*args)

    with mock.patch.object(triton_prompt_attention, "takes", fits), \
            mock.patch.object(triton_prompt_attention, "prompt_attention", spy):
        q, k, v, kv_cache, meta = make_step(8, 2, 64, 64, dtype)
        out = backend.forward(q, k, v, kv_cache, meta, 0.125)
        assert calls == [len(QUERY)]
        assert relative_error(out, q, kv_cache, meta, 0.125) < TOLERANCE[dtype]
        for query in ([1] * 3, [4, 1, 7]):  # decode-only; chunks of under 32 tokens
            calls.clear()
            tables = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
            short = paged_metadata(tables, [70, 100, 3], query, 64, DEVICE)
            kv = torch.randn(2, 13, 64, 2, 64, dtype=dtype, device=DEVICE)
            qs = torch.randn(sum(query), 8, 64, dtype=dtype, device=DEVICE)
            ks, vs = (torch.randn(sum(query), 2, 64, dtype=dtype, device=DEVICE)
                      for _ in range(2))
            out = backend.forward(qs, ks, vs, kv, short, 0.125)
            assert calls == []
            assert relative_error(out, qs, kv, short, 0.125) < TOLERANCE[dtype]
