"""TritonAttentionBackend against the torch reference, on ragged batches mixing prefill and decode.

Runs on a CUDA GPU. Without one, set TRITON_INTERPRET=1 (with triton installed) to run the same
cases on the CPU through Triton's interpreter (slow: select a few with -k).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import sys
from unittest import mock

import pytest
import torch

from hifc.layers import dense_attention, triton_fused
from hifc.layers.attention import (AttentionMetadata, LayerAttention, Rope, TorchAttentionBackend,
                                   reference_paged_attention, write_kv_cache)
from hifc.layers.dense_attention import (GRAPH_BUILD_SECONDS, SECONDS_SAVED_PER_FLOP, FusedShapes,
                                         chunk_call_shapes, dense_chunks_after, fresh_suffix)
from hifc.layers.triton_attention import TritonAttentionBackend, _segments, plan_launch
from hifc.layers.rotary import RotaryEmbedding
from hifc.layers.triton_jit import jit, tl
from tests.fixtures import paged_metadata
from tests.layers.test_triton_fused import torch_path

try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if torch.cuda.is_available():
    DEVICE = "cuda"
elif INTERPRET:
    DEVICE = "cpu"
else:
    DEVICE = None

_needs_device = pytest.mark.skipif(DEVICE is None or not HAS_TRITON,
                                   reason="needs CUDA and triton (or TRITON_INTERPRET=1)")


def device_test(fn):
    return pytest.mark.gpu(_needs_device(fn))

TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-3}


def make_step(query_lens, context_lens, num_q_heads, num_kv_heads, head_dim, block_size, dtype,
              seed, cache_prefix=None):
    """One step: q/k/v of the new tokens, a random cache and metadata with shuffled blocks.

    query_lens[i] new tokens of sequence i follow context_lens[i] tokens already cached.
    cache_prefix: if set, the cache is layer 1 of a [cache_prefix, 2, NB, BS, Hkv, D] tensor.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng = random.Random(seed)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 5
    free = list(range(num_blocks))
    rng.shuffle(free)
    max_blocks = max(blocks_per_seq) + 2
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    tables = []
    for i, n in enumerate(blocks_per_seq):
        table = [free.pop() for _ in range(n)]
        tables.append(table)
        block_tables[i, :n] = torch.tensor(table, dtype=torch.int32)
        block_tables[i, n:] = torch.randint(0, num_blocks, (max_blocks - n,), generator=gen)
    slots = []
    for table, c, s in zip(tables, context_lens, seq_lens):
        slots += [table[p // block_size] * block_size + p % block_size for p in range(c, s)]
    num_tokens = sum(query_lens)
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    cache_shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    if cache_prefix:
        kv_cache = rand(cache_prefix, *cache_shape)[1]
    else:
        kv_cache = rand(*cache_shape)
    q = rand(num_tokens, num_q_heads, head_dim) * 2  # sharper softmax than unit scores
    k = rand(num_tokens, num_kv_heads, head_dim)
    v = rand(num_tokens, num_kv_heads, head_dim)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=block_tables.to(DEVICE),
        query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=block_size)
    return q, k, v, kv_cache, meta


def check(backend, q, k, v, kv_cache, meta, dtype, sliding_window=None, logit_softcap=None):
    if DEVICE == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter gets bf16 tl.dot wrong")
    scale = 1.0 / math.sqrt(q.shape[-1])
    ref_cache = kv_cache.clone()
    write_kv_cache(k, v, ref_cache, meta.slot_mapping)
    ref = reference_paged_attention(q.float(), ref_cache.float(), meta, scale, sliding_window,
                                    logit_softcap)
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    result = backend.forward(q, k, v, kv_cache, meta, scale, sliding_window=sliding_window,
                             logit_softcap=logit_softcap, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(kv_cache, ref_cache), "KV write differs from write_kv_cache"
    assert not torch.isnan(out).any(), "output has NaN (unwritten or bad softmax)"
    err = ((out.float() - ref).norm() / ref.norm()).item()
    if os.environ.get("HIFC_ATTN_ERRLOG"):  # scripts/gpu_attention_check.py collects these
        with open(os.environ["HIFC_ATTN_ERRLOG"], "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]} {err:.3e}\n")
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"
    return err


# A ragged mix: decodes (1 token), prefills (no context), recompute-style prefills with context,
# chunked prefill continuing a context, in no particular order.
MIXED_QUERY = [1, 37, 1, 130, 5, 1, 64, 1, 200]
MIXED_CONTEXT = [300, 0, 17, 0, 90, 1000, 129, 0, 511]

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
BLOCK_SIZES = [16, 64, 256]


@device_test
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_mixed_batch_8b_shape(dtype, block_size):
    # GQA group 4, head_dim 128 (Llama-3-8B per-GPU shape, fewer heads).
    step = make_step(MIXED_QUERY, MIXED_CONTEXT, 16, 4, 128, block_size, dtype, seed=block_size)
    check(TritonAttentionBackend(), *step, dtype)


@device_test
@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", [
    (4, 4, 64),    # MHA
    (8, 2, 64),    # group 4
    (16, 2, 128),  # group 8
    (10, 2, 128),  # group 5 (Qwen 40/8)
    (8, 1, 80),    # head_dim not a power of two
    (6, 2, 96),    # group 3, head_dim 96
])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_head_shapes(num_q_heads, num_kv_heads, head_dim, block_size, dtype):
    step = make_step(MIXED_QUERY, MIXED_CONTEXT, num_q_heads, num_kv_heads, head_dim, block_size,
                     dtype, seed=num_q_heads * 7 + head_dim)
    check(TritonAttentionBackend(), *step, dtype)


@device_test
@pytest.mark.parametrize("split_kv", [False, True])
@pytest.mark.parametrize("group,block_size,dtype", [(4, 64, torch.bfloat16), (5, 16, torch.float16),
                                                    (8, 256, torch.float32)], ids=str)
def test_decode_only(split_kv, group, block_size, dtype):
    rng = random.Random(group)
    contexts = [rng.randrange(0, 3000) for _ in range(6)] + [0, 4095]
    step = make_step([1] * len(contexts), contexts, 2 * group, 2, 128, block_size, dtype,
                     seed=3 * group)
    backend = TritonAttentionBackend(split_kv=split_kv)
    assert (backend.plan(step[0], step[3], step[4]).num_segments > 1) == split_kv
    check(backend, *step, dtype)


class FixedSegments(TritonAttentionBackend):
    """Every launch split into num_segments segments of at least segment_tiles tiles."""

    def __init__(self, num_segments, segment_tiles):
        super().__init__(split_kv=False)
        self.segments = dict(num_segments=num_segments, segment_tiles=segment_tiles)

    def plan(self, q, kv_cache, meta, sliding_window=None):
        return dataclasses.replace(super().plan(q, kv_cache, meta, sliding_window),
                                   **self.segments)


@device_test
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_decode_with_fixed_size_segments(dtype):
    # Segments of at least 2 tiles: the short sequences use one (written directly, no merge),
    # the longer ones several, the longest all 8 (then longer than 2 tiles each).
    contexts = [0, 5, 60, 300, 1000, 2100, 4095, 40]
    step = make_step([1] * len(contexts), contexts, 8, 2, 128, 16, dtype, seed=17)
    backend = FixedSegments(8, 2)
    plan = backend.plan(step[0], step[3], step[4])
    assert plan.tile * plan.segment_tiles * plan.num_segments < max(contexts)
    check(backend, *step, dtype)


@jit
def _segments_of(spans_ptr, out_ptr, NUM_SEGMENTS: tl.constexpr, SEGMENT_TILES: tl.constexpr):
    i = tl.program_id(0)
    per, used = _segments(tl.load(spans_ptr + i), NUM_SEGMENTS, SEGMENT_TILES)
    tl.store(out_ptr + 2 * i, per)
    tl.store(out_ptr + 2 * i + 1, used)


@device_test
@pytest.mark.parametrize("num_segments,segment_tiles,spans,per,used", [
    # segments of at least segment_tiles; a last one of at most segment_tiles // 8 joins the
    # one before (33, 36, 68), one tile more does not (37, 69); long spans take num_segments
    (8, 32, [1, 32, 33, 36, 37, 64, 68, 69, 300, 1000], [32] * 8 + [38, 125],
     [1, 1, 1, 1, 2, 2, 2, 3, 8, 8]),
    # even splits (segment_tiles 1) and short segments: segments under 8 tiles keep a last
    # one of their own, however short
    (64, 1, [1, 5, 64, 65, 130], [1, 1, 1, 2, 3], [1, 5, 64, 33, 44]),
    (4, 4, [4, 5, 9, 100], [4, 4, 4, 25], [1, 2, 3, 4]),
])
def test_segments_rule(num_segments, segment_tiles, spans, per, used):
    spans_t = torch.tensor(spans, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(2 * len(spans), dtype=torch.int32, device=DEVICE)
    _segments_of[(len(spans),)](spans_t, out, NUM_SEGMENTS=num_segments,
                                SEGMENT_TILES=segment_tiles)
    assert out.view(-1, 2).T.tolist() == [per, used]


@device_test
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_segments_at_their_boundaries(dtype):
    # Segments of at least 8 tiles, at most 4: sequences of 8 tiles (one segment), 9 (the
    # ninth joins it), 10 (8 + 2), 16, 17 (8 + 9), 18 (8 + 8 + 2), 40 (four of 10), 9 with a
    # partial last tile, and 1 key
    tile = plan_launch(1, 1, 1, 8, 2, 128, torch.tensor([], dtype=dtype).element_size(), 132,
                       split_kv=False).tile
    seq_lens = [t * tile for t in (8, 9, 10, 16, 17, 18, 40)] + [9 * tile - tile // 2, 1]
    step = make_step([1] * len(seq_lens), [s - 1 for s in seq_lens], 8, 2, 128, 16, dtype,
                     seed=41)
    backend = FixedSegments(4, 8)
    assert backend.plan(step[0], step[3], step[4]).tile == tile
    check(backend, *step, dtype)


@device_test
def test_fixed_size_segments_on_mixed_batch_with_window():
    step = make_step(WINDOW_QUERY, WINDOW_CONTEXT, 4, 2, 32, 16, torch.float32, seed=23)
    check(FixedSegments(4, 2), *step, torch.float32, 33, 2.0)


class H200Sized(TritonAttentionBackend):
    """Plans for an H200's 132 SMs, in the interpreter too."""

    def num_sms(self, device):
        return 132


@device_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_default_plan_splits_a_short_chunk_over_a_long_context(dtype):
    # decodes beside a 48-token chunk after 6,000 computed tokens (a prompt chunked under a
    # prefill attention budget): segments of 2,048 keys or more, the chunk's rows merged from 3
    step = make_step([1, 48, 1, 1], [900, 6000, 5000, 30], 8, 2, 64, 64, dtype, seed=29)
    backend = H200Sized()
    plan = backend.plan(step[0], step[3], step[4])
    assert plan.num_segments == 4 and plan.block_q > 1
    assert plan.segment_tiles * plan.tile == 2048
    check(backend, *step, dtype)


@device_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("window,softcap", [(None, None), (40, 3.0)])
def test_leading_decodes_attended_apart_from_the_chunks(dtype, window, softcap):
    # num_leading_decodes (a chunk graph's step): the decodes in one launch, the chunk and the
    # sequences after it in another, one output
    step = make_step([1, 1, 1, 1, 40, 9], [300, 17, 0, 700, 129, 50], 8, 2, 64, 16, dtype,
                     seed=31)
    step[4].num_leading_decodes = 4
    backend = TritonAttentionBackend()
    check(backend, *step, dtype, window, softcap)
    decodes, rest = backend._apart_metas(step[4], 4)
    assert decodes.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert rest.query_start_loc.tolist() == [0, 40, 49] == rest.query_start_loc_cpu
    assert rest.seq_lens_cpu == [169, 59] and decodes.max_seq_len == rest.max_seq_len == 701


@device_test
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_kv_on_mixed_batch(dtype):
    step = make_step(MIXED_QUERY, MIXED_CONTEXT, 8, 2, 128, 64, dtype, seed=11)
    check(TritonAttentionBackend(split_kv=True), *step, dtype)


@device_test
def test_long_prefill_and_single_decode():
    # One 2k-token prefill over a 1k context, then a lone decode: the tile loop's causal bound.
    step = make_step([2048], [1000], 8, 2, 128, 64, torch.bfloat16, seed=5)
    check(TritonAttentionBackend(), *step, torch.bfloat16)
    step = make_step([1], [8000], 8, 2, 128, 16, torch.bfloat16, seed=6)
    check(TritonAttentionBackend(), *step, torch.bfloat16)


# Small enough for the interpreter: decodes, a prefill, a chunk continuing a context, over
# windows narrower and wider than the contexts and not multiples of the block or tile size.
WINDOW_QUERY = [1, 40, 1, 9, 1]
WINDOW_CONTEXT = [90, 0, 7, 50, 0]


@device_test
@pytest.mark.parametrize("split_kv", [False, True])
@pytest.mark.parametrize("sliding_window,logit_softcap", [(13, None), (33, None), (None, 2.0),
                                                          (20, 1.5)])
def test_sliding_window_and_softcap(sliding_window, logit_softcap, split_kv):
    step = make_step(WINDOW_QUERY, WINDOW_CONTEXT, 4, 2, 32, 16, torch.float32, seed=21)
    check(TritonAttentionBackend(split_kv=split_kv), *step, torch.float32, sliding_window,
          logit_softcap)


@device_test
@pytest.mark.skipif(INTERPRET, reason="head_dim 256 is slow in the interpreter")
@pytest.mark.parametrize("split_kv", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gemma2_shape_window_and_softcap(dtype, split_kv):
    # Gemma-2-9B per layer: 16 query / 8 KV heads of 256, window 4096 crossed, scores capped at 50.
    step = make_step([1, 300, 1, 1], [5000, 0, 4000, 100], 16, 8, 256, 16, dtype, seed=31)
    check(TritonAttentionBackend(split_kv=split_kv), *step, dtype, 4096, 50.0)


def test_reference_honours_window_and_softcap():
    # 3 new tokens after 40 cached ones; keys 0..42, block size 4, one KV head for 2 query heads.
    gen = torch.Generator().manual_seed(3)
    kv_cache = torch.randn(2, 11, 4, 1, 8, generator=gen)
    q = torch.randn(43, 2, 8, generator=gen)[-3:]
    meta = paged_metadata([list(range(11))], [40], [3], 4, "cpu")
    full = reference_paged_attention(q, kv_cache, meta, 1.0)
    windowed = reference_paged_attention(q, kv_cache, meta, 1.0, sliding_window=5)
    capped = reference_paged_attention(q, kv_cache, meta, 1.0, logit_softcap=0.5)
    own_key_only = reference_paged_attention(q, kv_cache, meta, 1.0, sliding_window=1)
    values = kv_cache[1].reshape(44, 1, 8)  # [slot, Hkv, D]; slot = position here
    assert torch.equal(own_key_only, values[40:43].expand(3, 2, 8))
    assert not torch.allclose(full, windowed) and not torch.allclose(full, capped)
    wide = reference_paged_attention(q, kv_cache, meta, 1.0, sliding_window=43)
    torch.testing.assert_close(wide, full)  # a window holding the whole context changes nothing


@device_test
def test_strided_q_and_layer_slice_cache():
    # q sliced out of a fused qkv projection; the cache is one layer of a [L, 2, ...] tensor.
    q, k, v, kv_cache, meta = make_step(MIXED_QUERY, MIXED_CONTEXT, 8, 2, 64, 16,
                                        torch.float16, seed=9, cache_prefix=3)
    qkv = torch.cat([q, k, v], dim=1)  # [T, Hq + 2 Hkv, D]
    q_view, k_view, v_view = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    assert not q_view.is_contiguous()
    check(TritonAttentionBackend(triton_kv_write=True), q_view, k_view, v_view, kv_cache, meta,
          torch.float16)


@device_test
def test_torch_kv_write_option_matches():
    step = make_step(MIXED_QUERY, MIXED_CONTEXT, 8, 2, 128, 64, torch.bfloat16, seed=12)
    check(TritonAttentionBackend(triton_kv_write=False), *step, torch.bfloat16)


@device_test
def test_same_result_as_torch_backend():
    q, k, v, kv_cache, meta = make_step(MIXED_QUERY, MIXED_CONTEXT, 8, 2, 64, 16,
                                        torch.float32, seed=13)
    torch_cache = kv_cache.clone()
    scale = 0.125
    ref = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, scale)
    out = TritonAttentionBackend().forward(q, k, v, kv_cache, meta, scale)
    assert torch.equal(kv_cache, torch_cache)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-3


def test_plan_splits_small_long_decodes_and_long_full_ones():
    common = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, elem_size=2, num_sms=132)
    # decodes: 64-key tiles, contexts split evenly into segments of a tile or more until there
    # are about 4 programs per SM (8 programs per sequence), at most 32 where the launch then
    # merges them itself (4 query heads x 32 segments), else 64
    one = plan_launch(1, 4096, 1, **common)
    assert (one.tile, one.num_segments, one.segment_tiles) == (64, 32, 1)
    assert plan_launch(1, 4096, 1, **common | dict(num_q_heads=40)).num_segments == 64
    assert plan_launch(1, 4096, 2, **common).num_segments == 32
    assert plan_launch(1, 4096, 4, **common).num_segments == 16
    assert plan_launch(1, 4096, 32, **common).num_segments == 2
    assert plan_launch(1, 4096, 33, **common).num_segments == 2
    assert plan_launch(1, 100, 1, **common).num_segments == 1  # one tile
    assert plan_launch(1, 200, 1, **common).num_segments == 2
    assert plan_launch(512, 4096, 1, **common).num_segments == 1
    # a full batch that may hold longer contexts: segments of 32 tiles of 128 keys (4096
    # keys), at most 8
    long = plan_launch(1, 17341, 32, **common)
    assert (long.tile, long.num_segments, long.segment_tiles) == (128, 8, 32)
    # ... unless even slices are no longer than that: contexts up to 2 x 4096 keys at batch 32
    just_past = plan_launch(1, 4190, 32, **common)
    assert (just_past.tile, just_past.num_segments, just_past.segment_tiles) == (64, 2, 1)
    assert plan_launch(1, 8192, 32, **common).segment_tiles == 1
    assert plan_launch(1, 8193, 32, **common).segment_tiles == 32
    # too many programs for 2 segments each at about 4 per SM (from batch 34): balanced
    # segments of 64-key tiles, also where every context fills one
    for batch, cap in itertools.product((34, 64, 128), (100, 4096, 4097, 8192)):
        full = plan_launch(1, cap, batch, **common)
        assert (full.tile, full.num_segments, full.segment_tiles) == (64, 2, 64)
    assert plan_launch(1, 17341, 128, **common).num_segments == 8
    assert plan_launch(1, 131072, 32, **common).num_segments == 8
    # steps with prompt chunks over long contexts, up to MIXED_SPLIT_MAX_TOKENS tokens, whose
    # longest chunk is at most 3/4 x 132 programs: segments of 16 tiles (2,048 keys), as many
    # as the longest context fills, at most 32, and tokens x segments within 8,192
    chunk = plan_launch(64, 32768, 33, num_tokens=96, **common)
    assert (chunk.num_segments, chunk.segment_tiles) == (16, 16)
    assert plan_launch(2, 17341, 32, **common).num_segments == 16  # 64 tokens at most
    assert plan_launch(8, 131072, 2, num_tokens=9, **common).num_segments == 32
    assert plan_launch(257, 32768, 34, num_tokens=290, **common).num_segments == 16  # 72
    assert plan_launch(512, 32768, 33, num_tokens=544, **common).num_segments == 1  # 128
    assert plan_launch(256, 32768, 33, num_tokens=1025, **common).num_segments == 1
    assert plan_launch(256, 4096, 33, num_tokens=288, **common).num_segments == 1
    prefill = plan_launch(8192, 8192, 1, **common)
    assert prefill.block_m == 128 and prefill.block_q == 32


@device_test
def test_triton_kv_write_skips_negative_slots():
    from hifc.layers.triton_kv_write import triton_write_kv_cache
    _, k, v, kv_cache, meta = make_step([3, 1], [5, 20], 4, 2, 64, 16, torch.float16, seed=14)
    slots = meta.slot_mapping.clone()
    slots[1] = -1  # a padding token
    expected = kv_cache.clone()
    keep = slots >= 0
    write_kv_cache(k[keep], v[keep], expected, slots[keep])
    triton_write_kv_cache(k, v, kv_cache, slots)
    assert torch.equal(kv_cache, expected)


def rope_step(step, seed):
    """The step's RoPE (rotary tables of its head_dim, a position per token) as a Rope."""
    q, _, _, _, meta = step
    rotary = RotaryEmbedding(q.shape[-1], 4096, 10000.0, None, q.dtype, torch.device(DEVICE))
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, (q.shape[0],), generator=gen).to(DEVICE)
    return Rope(rotary, positions)


def unrotated_step(query_lens, context_lens, num_q_heads, head_dim, fp8, seed):
    """A float16 step over two KV heads whose q (a strided view, as the projection gives it) and
    k are not rotated yet: (q, k, v, cache, metadata, K/V scales of a float8 cache or None,
    its Rope)."""
    step = make_step(query_lens, context_lens, num_q_heads, 2, head_dim, 16, torch.float16,
                     seed=seed)
    q, k, v, kv_cache, meta = step
    q = torch.cat([q, k, v], dim=1)[:, :num_q_heads]
    kv_scale = None
    if fp8:
        _, k, v, kv_cache, _, kv_scale = fp8_step(step, seed)
    return q, k, v, kv_cache, meta, kv_scale, rope_step(step, seed)


@device_test
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
@pytest.mark.parametrize("head_dim", [128, 96])
def test_rotary_kv_write_matches_rotary_then_write(fp8, head_dim):
    # One launch rotates q and k and writes the rotated k and v: the same q, k and cache as
    # the rotary kernel then the KV write, a padding slot skipped.
    from hifc.layers.triton_kv_write import rotary_write_kv_cache, triton_write_kv_cache
    q, k, v, kv_cache, meta, kv_scale, rope = unrotated_step([3, 1, 2], [5, 20, 0], 6,
                                                              head_dim, fp8, seed=15)
    slots = meta.slot_mapping.clone()
    slots[1] = -1  # a padding token
    expected_cache = kv_cache.clone()
    expected_q, expected_k = triton_fused.rotary(rope.positions, q, k, rope.rotary.cos_cache,
                                                 rope.rotary.sin_cache)
    triton_write_kv_cache(expected_k, v, expected_cache, slots, kv_scale)
    out_q, out_k = rotary_write_kv_cache(rope.positions, q, k, v, rope.rotary.cos_cache,
                                         rope.rotary.sin_cache, kv_cache, slots, kv_scale)
    assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)
    if fp8:
        check_fp8_write(kv_cache, expected_cache, slots[slots >= 0])
    else:
        assert torch.equal(kv_cache, expected_cache)


@device_test
@pytest.mark.parametrize("triton_kv_write", [True, False])
def test_backend_applies_rope_as_the_torch_backend_does(triton_kv_write):
    # q and k not yet rotated: the Triton backend (rotation fused into the KV write, or the
    # rotary kernel then torch's write) against the torch backend rotating them in torch.
    step = make_step(MIXED_QUERY, MIXED_CONTEXT, 8, 2, 64, 16, torch.float16, seed=16)
    q, k, v, kv_cache, meta = step
    rope = rope_step(step, 16)
    torch_cache = kv_cache.clone()
    with torch_path():
        ref = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, 0.125, rope=rope)
    out = TritonAttentionBackend(triton_kv_write=triton_kv_write).forward(
        q, k, v, kv_cache, meta, 0.125, rope=rope)
    assert torch.equal(kv_cache, torch_cache)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-3


@device_test
@pytest.mark.parametrize("fp8", [False, True], ids=["fp16-cache", "fp8-cache"])
@pytest.mark.parametrize("head_dim,num_segments", [(128, 1), (128, 8), (96, 4)])
def test_decode_step_rotates_and_writes_in_the_attention_launch(fp8, head_dim, num_segments):
    # A decode-only step given q and k unrotated: the attention's launch rotates them and
    # writes k and v (a padding slot skipped) -- the same cache, bit for bit, and the same
    # output as the RoPE + KV-write kernel followed by the attention.
    from hifc.layers.triton_attention import paged_attention
    from hifc.layers.triton_kv_write import rotary_write_kv_cache
    contexts = [0, 70, 15, 300, 129]
    q, k, v, kv_cache, meta, kv_scale, rope = unrotated_step([1] * len(contexts), contexts, 8,
                                                              head_dim, fp8, seed=18)
    meta = dataclasses.replace(meta, slot_mapping=meta.slot_mapping.clone())
    meta.slot_mapping[2] = -1  # a padding token
    plan = dataclasses.replace(FixedSegments(num_segments, 1).plan(q, kv_cache, meta),
                               num_segments=num_segments)
    expected_cache = kv_cache.clone()
    rotated_q, _ = rotary_write_kv_cache(rope.positions, q, k, v, rope.rotary.cos_cache,
                                         rope.rotary.sin_cache, expected_cache, meta.slot_mapping,
                                         kv_scale)
    expected = paged_attention(rotated_q, expected_cache, meta, 0.1, plan, kv_scale=kv_scale)
    out = paged_attention(q, kv_cache, meta, 0.1, plan, kv_scale=kv_scale, rope=rope, k=k, v=v)
    assert torch.equal(kv_cache.view(torch.uint8), expected_cache.view(torch.uint8))
    assert torch.equal(out, expected)


@device_test
def test_backend_rotates_decode_steps_in_the_attention_launch():
    # Through the backend: a decode-only step with RoPE, evenly split, takes the one launch,
    # and matches the torch backend.
    contexts = [5, 200, 1000, 17]
    step = make_step([1] * len(contexts), contexts, 8, 2, 64, 16, torch.float16, seed=19)
    q, k, v, kv_cache, meta = step
    rope = rope_step(step, 19)
    torch_cache = kv_cache.clone()
    with torch_path():
        ref = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, 0.125, rope=rope)
    backend = FixedSegments(4, 1)
    with mock.patch("hifc.layers.triton_kv_write.rotary_write_kv_cache",
                    side_effect=AssertionError("a separate RoPE + KV-write launch")):
        out = backend.forward(q, k, v, kv_cache, meta, 0.125, rope=rope)
    assert torch.equal(kv_cache, torch_cache)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-3


@device_test
def test_leading_decodes_rotate_in_their_launch_as_the_decode_graphs():
    # A step of decodes then prompt chunks, its decodes attended apart, on a backend told the
    # decode graphs' sizes: the decodes take the plan of the graph of their padded batch (5 ->
    # 8 rows) and cap, rotated and written in their attention launch as that graph's are; the
    # RoPE + KV-write kernel writes the chunks' rows only. Cache and output as the torch
    # backend's.
    from hifc.layers import triton_attention, triton_kv_write
    step = make_step([1, 1, 1, 1, 1, 40, 9], [300, 17, 0, 700, 129, 50, 20], 8, 2, 64, 16,
                     torch.float16, seed=24)
    q, k, v, kv_cache, meta = step
    meta.num_leading_decodes = 5
    rope = rope_step(step, 24)
    torch_cache = kv_cache.clone()
    with torch_path():
        ref = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, 0.125, rope=rope)
    backend = H200Sized()
    backend.plan_decodes_as_graphs([1, 2, 4, 8], 1024, 8, kv_cache, torch.float16)
    graph_plan = plan_launch(1, 1024, 8, 8, 2, 64, 2, 132)
    assert triton_attention.rotates_in_launch(graph_plan)
    with mock.patch.object(triton_kv_write, "rotary_write_kv_cache",
                           wraps=triton_kv_write.rotary_write_kv_cache) as rotary_write, \
            mock.patch.object(triton_attention, "paged_attention",
                              wraps=triton_attention.paged_attention) as attend:
        out = backend.forward(q, k, v, kv_cache, meta, 0.125, rope=rope)
    assert [c.args[1].shape[0] for c in rotary_write.call_args_list] == [49]
    decodes_call = attend.call_args_list[0]
    assert decodes_call.args[0].shape[0] == 5 and decodes_call.args[4] == graph_plan
    assert torch.equal(decodes_call.kwargs["rope"].positions, rope.positions[:5])
    assert torch.equal(kv_cache, torch_cache)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-3


@device_test
@pytest.mark.parametrize("fp8", [False, True], ids=["fp16-cache", "fp8-cache"])
@pytest.mark.parametrize("graphs,split_kv", [(False, None), (True, None), (False, False)],
                         ids=["own-plan", "graph-plan", "unsplit"])
@pytest.mark.parametrize("window,softcap", [(None, None), (40, 3.0)])
def test_kept_rows_attend_alone_as_in_the_whole_step(fp8, graphs, split_kv, window, softcap):
    # A last layer's step: decodes, then prompt chunks of which some rows are kept (a chunk's
    # last, one inside a chunk; none of the last chunk). forward_kept writes every row's K/V as
    # forward does, bit for bit, and gives forward's attention at the kept rows. Told the decode
    # graphs, the kept rows take the plan of the graph of their padded batch (5 -> 8 rows),
    # rotated and written again in its launch, after one RoPE + KV-write launch of every row;
    # unsplit, their launch takes them rotated.
    from hifc.layers import triton_attention, triton_kv_write
    from hifc.layers.attention import kept_rows
    q, k, v, kv_cache, meta, kv_scale, rope = unrotated_step(
        [1, 1, 40, 9, 30], [300, 17, 50, 700, 0], 8, 64, fp8, seed=31)
    qsl = meta.query_start_loc_cpu
    rows = [0, 1, qsl[3] - 1, 10, qsl[4] - 1]
    backend = H200Sized(split_kv=split_kv)
    if graphs:
        backend.plan_decodes_as_graphs([1, 2, 4, 8], 1024, 8, kv_cache, torch.float16)
    whole_cache = kv_cache.clone()
    options = dict(sliding_window=window, logit_softcap=softcap, kv_scale=kv_scale, rope=rope)
    whole = backend.forward(q, k, v, whole_cache, meta, 0.125, **options)
    kept = kept_rows(meta, rows)
    with mock.patch.object(triton_kv_write, "rotary_write_kv_cache",
                           wraps=triton_kv_write.rotary_write_kv_cache) as rotary_write, \
            mock.patch.object(triton_attention, "paged_attention",
                              wraps=triton_attention.paged_attention) as attend:
        out = backend.forward_kept(q, k, v, kv_cache, meta, kept, 0.125, **options)
    assert torch.equal(kv_cache.view(torch.uint8), whole_cache.view(torch.uint8))
    expected = whole[rows].float()
    assert ((out.float() - expected).norm() / expected.norm()).item() < 2e-3
    assert [c.args[1].shape[0] for c in rotary_write.call_args_list] == [q.shape[0]]
    (call,) = attend.call_args_list
    assert call.args[0].shape[0] == len(rows)
    assert ("rope" in call.kwargs) == triton_attention.rotates_in_launch(call.args[4])
    if window is None:  # a window's keys plan otherwise (no split over them)
        graph_plan = plan_launch(1, 1024, 8, 8, 2, 64, 2, 132)
        assert (call.args[4] == graph_plan) == graphs
        assert triton_attention.rotates_in_launch(graph_plan)
        assert triton_attention.rotates_in_launch(call.args[4]) == (split_kv is None)
    empty = backend.forward_kept(q, k, v, kv_cache, meta, kept_rows(meta, []), 0.125,
                                 **options)
    assert empty.shape == (0, *q.shape[1:])


def test_leading_decodes_plan_as_the_decode_graph_of_their_padded_batch():
    # Whatever a step's count of leading decodes and longest context, their launch plan is one
    # a decode graph was planned with (so no kernel variant of their own is compiled mid-run);
    # past the largest graph, or on a backend not told the graphs, the decodes' own plan.
    from hifc.runtime.cuda_graphs import capture_sizes
    q = torch.zeros(1, 32, 128, dtype=torch.bfloat16)
    kv_cache = torch.zeros(2, 1, 16, 8, 128, dtype=torch.bfloat16)
    backend = H200Sized()
    sizes = capture_sizes(64)
    caps = backend.plan_decodes_as_graphs(sizes, 32768, 32, kv_cache, torch.bfloat16)
    graph_plans = {plan_launch(1, cap, b, 32, 8, 128, 2, 132) for b in sizes for cap in caps[b]}

    def decodes(n, longest):
        return AttentionMetadata(torch.zeros(n), torch.zeros(n + 1), torch.zeros(n),
                                 torch.zeros(n, 1), list(range(n + 1)), [1] * n, 1, longest, 16)

    planned = {backend._decodes_plan(q, kv_cache, decodes(n, longest), None)
               for n in range(1, 65) for longest in (1, 100, 1025, 4096, 4097, 9000, 32768)}
    assert planned <= graph_plans and len(planned) > 4
    assert backend._decodes_plan(q, kv_cache, decodes(5, 300), None) == plan_launch(
        1, 4096, 8, 32, 8, 128, 2, 132)
    # 30 decodes just past 4,096 keys: batch 32's graph for up to 8,192, an even split
    past = backend._decodes_plan(q, kv_cache, decodes(30, 4100), None)
    assert past == plan_launch(1, 8192, 32, 32, 8, 128, 2, 132) == plan_launch(
        1, 4096, 32, 32, 8, 128, 2, 132) and past.segment_tiles == 1
    assert backend._decodes_plan(q, kv_cache, decodes(70, 300), None) == plan_launch(
        1, 300, 70, 32, 8, 128, 2, 132)
    assert H200Sized()._decodes_plan(q, kv_cache, decodes(5, 300), None) == plan_launch(
        1, 300, 5, 32, 8, 128, 2, 132)


def test_decode_rope_in_the_attention_launch_refuses_other_steps(monkeypatch):
    # checked on the host before any launch: CPU tensors will do
    from hifc.layers.triton_attention import paged_attention
    monkeypatch.setattr(sys.modules[__name__], "DEVICE", "cpu")
    step = make_step([2, 1], [5, 20], 4, 2, 64, 16, torch.float16, seed=20)
    q, k, v, kv_cache, meta = step
    plan = plan_launch(2, 22, 2, 4, 2, 64, 2, 8)
    with pytest.raises(ValueError, match="decode-only"):
        paged_attention(q, kv_cache, meta, 0.1, plan, rope=rope_step(step, 20), k=k, v=v)


@device_test
@pytest.mark.parametrize("group,num_segments", [(8, 8), (4, 16), (5, 4), (4, 32), (5, 16)])
def test_decode_merge_in_the_last_program(group, num_segments):
    # Decode-only launches of few segments merge each sequence's partials in the program of
    # its KV head that finishes last, and leave every arrival counter at zero for the next
    # launch.
    from hifc.layers import triton_attention
    contexts = [600, 0, 37, 1500, 250]
    backend = FixedSegments(num_segments, 1)
    backend.plan = lambda *a, **kw: dataclasses.replace(
        FixedSegments.plan(backend, *a, **kw), tile=16)
    assert triton_attention.merges_in_launch(num_segments, group)
    for seed in (21, 22):
        step = make_step([1] * len(contexts), contexts, 2 * group, 2, 128, 16, torch.float32,
                         seed=seed + group)
        with mock.patch.object(triton_attention, "_merge_segments_kernel",
                               side_effect=AssertionError("a merge kernel launched")):
            check(backend, *step, torch.float32)
        assert not triton_attention._arrival_buffers[step[0].device][-1].any()


def test_which_decode_launches_merge_in_the_launch():
    from hifc.layers.triton_attention import merges_in_launch
    assert merges_in_launch(32, 4) and merges_in_launch(2, 4) and merges_in_launch(16, 5)
    assert not merges_in_launch(1, 4)  # nothing to merge
    assert not merges_in_launch(64, 4) and not merges_in_launch(32, 5)  # too many partials


def test_which_decode_steps_rotate_in_the_attention_launch():
    from hifc.layers.triton_attention import rotates_in_launch
    common = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, elem_size=2, num_sms=132)
    assert rotates_in_launch(plan_launch(1, 4096, 1, **common))  # even splits
    assert rotates_in_launch(plan_launch(1, 4096, 32, **common))
    assert rotates_in_launch(plan_launch(1, 8192, 32, **common))  # even past 4,096 keys
    balanced = plan_launch(1, 8193, 32, **common)
    assert balanced.segment_tiles > 1 and not rotates_in_launch(balanced)
    whole = plan_launch(1, 4096, 32, split_kv=False, **common)
    assert whole.num_segments == 1 and not rotates_in_launch(whole)
    assert not rotates_in_launch(plan_launch(1, 4096, 128, **common))  # balanced


def test_decode_programs_of_one_tile_take_one_stage():
    common = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, elem_size=2, num_sms=132)
    one_tile = plan_launch(1, 2048, 1, **common)
    assert one_tile.num_segments * one_tile.tile >= 2048 and one_tile.num_stages == 1
    assert plan_launch(1, 4096, 1, **common).num_stages == 2  # 32 segments of 2 tiles
    assert plan_launch(1, 4096, 4, **common).num_stages == 2  # 16 segments of 4 tiles
    assert plan_launch(1, 8192, 32, **common).num_stages == 2  # balanced segments


# ---- float8 KV cache ------------------------------------------------------------------------
FP8 = torch.float8_e4m3fn
FP8_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-3}


def fp8_step(step, seed):
    """The step with its cache in float8 (each head quantised with its own K and V scale) and
    the scales ([2, Hkv] float32): per-head scales that are not 1 put the scaling to the test."""
    q, k, v, kv_cache, meta = step
    num_kv_heads = kv_cache.shape[-2]
    gen = torch.Generator().manual_seed(seed)
    kv_scale = (0.01 + 0.1 * torch.rand(2, num_kv_heads, generator=gen)).to(DEVICE)
    cache = (kv_cache.float() / kv_scale[:, None, None, :, None]).clamp(-448, 448).to(FP8)
    return q, k * 8, v * 8, cache, meta, kv_scale  # new K/V beyond 448 * scale get clamped


def check_fp8_write(written, expected, slot_mapping):
    """The float8 bytes of the new tokens' slots match torch's quantisation, and no other slot
    changed. The interpreter rounds some float32 -> float8 casts wrongly (a carry into the
    exponent is lost: 127.9 becomes 64, not 128; subnormals truncate), so there a few values
    may differ, by less than half their size (a missing or wrong scale moves nearly all)."""
    num_kv_heads, head_dim = written.shape[-2:]
    caches = [c.view(torch.uint8).reshape(2, -1, num_kv_heads, head_dim)
              for c in (written, expected)]
    new = [c[:, slot_mapping] for c in caches]
    differ = new[0] != new[1]
    if INTERPRET:
        w, e = (c.view(FP8).float() for c in new)
        assert differ.float().mean() < 0.1 and ((w - e).abs() <= e.abs() / 2 + 2 ** -8).all()
    else:
        assert not differ.any(), f"{differ.float().mean():.1%} of the float8 KV bytes differ"
    untouched = torch.ones(caches[0].shape[1], dtype=torch.bool, device=written.device)
    untouched[slot_mapping] = False
    assert torch.equal(caches[0][:, untouched], caches[1][:, untouched]), \
        "the KV write touched other slots"


def check_fp8(backend, q, k, v, kv_cache, meta, kv_scale, dtype, sliding_window=None,
              logit_softcap=None):
    """The write against torch's quantisation, and the attention against the reference reading
    the float8 cache the backend wrote (a bfloat16 q attends in float16: the interpreter runs
    it too)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    expected = kv_cache.clone()
    write_kv_cache(k, v, expected, meta.slot_mapping, kv_scale)
    out = torch.full_like(q, float("nan"))
    backend.forward(q, k, v, kv_cache, meta, scale, sliding_window=sliding_window,
                    logit_softcap=logit_softcap, kv_scale=kv_scale, out=out)
    assert kv_cache.dtype == FP8
    check_fp8_write(kv_cache, expected, meta.slot_mapping)
    ref = reference_paged_attention(q.float(), kv_cache, meta, scale, sliding_window,
                                    logit_softcap, kv_scale)
    assert not torch.isnan(out).any()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < FP8_TOLERANCE[dtype], f"relative error {err:.2e}"


@device_test
@pytest.mark.parametrize("split_kv", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads", [(8, 2, 64), (32, 8, 128)], ids=["small", "8b-heads"])
def test_fp8_cache_decode(dtype, split_kv, heads):
    contexts = [700, 0, 2000, 33]
    step = make_step([1] * len(contexts), contexts, *heads, 16, dtype, seed=41)
    backend = TritonAttentionBackend(split_kv=split_kv)
    assert (backend.plan(step[0], step[3], step[4]).num_segments > 1) == split_kv
    check_fp8(backend, *fp8_step(step, 41), dtype)


@device_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fp8_cache_mixed_batch(dtype):
    step = make_step(WINDOW_QUERY, WINDOW_CONTEXT, 8, 2, 64, 16, dtype, seed=42)
    check_fp8(TritonAttentionBackend(), *fp8_step(step, 42), dtype)


@device_test
@pytest.mark.parametrize("split_kv", [False, True])
def test_fp8_cache_window_and_softcap(split_kv):
    step = make_step(WINDOW_QUERY, WINDOW_CONTEXT, 4, 2, 32, 16, torch.float32, seed=43)
    check_fp8(TritonAttentionBackend(split_kv=split_kv), *fp8_step(step, 43), torch.float32,
              20, 1.5)


@device_test
def test_fp8_torch_kv_write_option_matches():
    step = make_step(WINDOW_QUERY, WINDOW_CONTEXT, 8, 2, 64, 16, torch.float16, seed=44)
    check_fp8(TritonAttentionBackend(triton_kv_write=False), *fp8_step(step, 44), torch.float16)


@device_test
def test_fp8_triton_kv_write_skips_negative_slots():
    from hifc.layers.triton_kv_write import triton_write_kv_cache
    _, k, v, kv_cache, meta, kv_scale = fp8_step(
        make_step([3, 1], [5, 20], 4, 2, 64, 16, torch.float16, seed=45), 45)
    slots = meta.slot_mapping.clone()
    slots[1] = -1  # a padding token
    expected = kv_cache.clone()
    keep = slots >= 0
    write_kv_cache(k[keep], v[keep], expected, slots[keep], kv_scale)
    triton_write_kv_cache(k, v, kv_cache, slots, kv_scale)
    check_fp8_write(kv_cache, expected, slots[keep])


@device_test
def test_fp8_cache_needs_its_scales():
    q, k, v, kv_cache, meta, kv_scale = fp8_step(
        make_step([1], [10], 4, 2, 32, 16, torch.float32, seed=46), 46)
    with pytest.raises(ValueError, match="float8 KV cache needs kv_scale"):
        TritonAttentionBackend().forward(q, k, v, kv_cache, meta, 0.1)
    with pytest.raises(ValueError, match="kv_scale is only for float8"):
        TritonAttentionBackend().forward(q, k, v, kv_cache.float(), meta, 0.1, kv_scale=kv_scale)


@device_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("query_lens", [[1500], [600, 37, 1024], [513, 700]])
def test_fresh_prompts_attend_densely(dtype, query_lens):
    # Fresh prompts (no cached context) go through torch's fused SDPA; GQA 4:1 and 1:1.
    for q_heads, kv_heads in ((8, 2), (4, 4)):
        step = make_step(query_lens, [0] * len(query_lens), q_heads, kv_heads, 128, 64, dtype,
                         seed=len(query_lens))
        assert dense_chunks_after(step[-1], dtype, 1) == 0
        dense = check(TritonAttentionBackend(dense_prefill=True), *step, dtype)
        paged = check(TritonAttentionBackend(dense_prefill=False), *step, dtype)
        assert dense < 2 * paged + 1e-3


@device_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_size", [16, 64])
def test_prompt_chunks_after_cached_context_and_decodes_attend_densely(dtype, block_size):
    # Decodes first (the paged kernel), then chunks over cached context (the fused kernels over
    # gathered keys and over their own, merged by log-sum-exp), a fresh prompt among them;
    # contexts that end inside a block. GQA 4:1 and 1:1.
    cases = [([1, 1, 600, 40, 520], [300, 1000, 900, 77, 0]), ([530], [1200])]
    for (query_lens, context_lens), (q_heads, kv_heads) in zip(cases, ((8, 2), (4, 4))):
        step = make_step(query_lens, context_lens, q_heads, kv_heads, 128, block_size, dtype,
                         seed=block_size + len(query_lens))
        assert dense_chunks_after(step[-1], dtype, 1) == query_lens.count(1)
        check(TritonAttentionBackend(dense_prefill=True), *step, dtype)


@device_test
def test_fresh_chunks_after_a_chunk_over_context_attend_densely_apart():
    # FusedShapes has built the fresh chunks' padded shape but never met the chunk over cached
    # context: the decodes and that chunk take the paged kernel, the fresh chunks after them
    # the fused kernels; a second step of other fresh lengths in the same padded length too.
    dtype = torch.float16
    cases = [([1, 1, 40, 600, 530], [300, 90, 700, 0, 0]), ([1, 33, 1000], [64, 500, 0])]
    backend = TritonAttentionBackend(num_layers=32)
    for query_lens, context_lens in cases:
        step = make_step(query_lens, context_lens, 8, 2, 128, 16, dtype, seed=sum(query_lens))
        q, k, v, _, meta = step
        fresh = max(i for i, c in enumerate(context_lens) if c) + 1
        t = meta.query_start_loc_cpu[fresh]
        rest = TritonAttentionBackend()._apart_metas(meta, fresh)[1]
        backend.fused_shapes.record(chunk_call_shapes(q[t:], k[t:], v[t:], rest)[0], True)
        dense_calls = []
        real = dense_attention.dense_prefill_attention

        def spy(q_, k_, v_, kv_cache, meta_, scale, out=None):
            dense_calls.append(meta_.num_seqs)
            return real(q_, k_, v_, kv_cache, meta_, scale, out)

        with mock.patch("hifc.layers.triton_attention.dense_prefill_attention", spy):
            check(backend, *step, dtype)
        assert dense_calls == [len(query_lens) - fresh]
        assert backend._dense_chunks_after(q, k, v, meta) == (query_lens.count(1), fresh)
    # no shape built or seen: the paged kernel for all of them
    step = make_step([1, 40, 600], [300, 700, 0], 8, 2, 128, 16, dtype, seed=5)
    fresh_backend = TritonAttentionBackend(num_layers=32)
    assert fresh_backend._dense_chunks_after(*step[:3], step[-1]) == (None, None)


def test_fresh_chunks_share_their_padded_shape():
    # as a step holds them: q and k tensors of their own, v a view of the QKV output
    q, k = torch.zeros(3000, 8, 4), torch.zeros(3000, 2, 4)
    v = torch.zeros(3000, (8 + 2 + 2) * 4)[:, 40:].view(3000, 2, 4)

    def shapes(query_lens, context_lens=None):
        meta = host_meta(query_lens, context_lens or [0] * len(query_lens))
        t = sum(query_lens)
        return chunk_call_shapes(q[:t], k[:t], v[:t], meta)[0]

    assert shapes([600]) == shapes([1000]) == shapes([513])
    assert shapes([600])[0][1] == 1024 and shapes([1025])[0][1] == 1536
    assert shapes([1024]) == shapes([1000])  # in tensors of their own, whatever the length
    assert shapes([600], [64]) != shapes([700], [64])  # after cached context: not padded
    assert dense_attention.padded(1) == 512 and dense_attention.padded(512) == 512


def test_a_fresh_chunk_is_copied_only_where_it_needs_padding_or_is_strided():
    q = torch.randn(1536, 8, 4)
    v = torch.randn(1536, (8 + 2 + 2) * 4)[:, 40:].view(1536, 2, 4)
    whole = dense_attention._padded_heads(q[512:1536], 1024)  # a whole padded length already
    assert whole.data_ptr() == q[512].data_ptr()
    for x, n in ((q, 1000), (v, 1024)):  # short of the padded length; a view of the QKV output
        heads = dense_attention._padded_heads(x[:n], 1024)
        assert heads.data_ptr() != x.data_ptr()
        assert torch.equal(heads[0, :, :n], x[:n].transpose(0, 1))
        assert not heads[0, :, n:].any()
        # the same layout as a chunk taken whole, so that both meet one cuDNN graph
        assert heads.shape[1:] == (x.shape[1], 1024, 4) and heads.stride()[1:] == (
            4, x.shape[1] * 4, 1)
    assert whole.stride() == dense_attention._padded_heads(q[:1000], 1024).stride()


@device_test
def test_warm_up_meets_each_kind_of_fused_call():
    # Fresh chunks and chunks after cached keys, their lengths whole 64-token tiles or not (the
    # kinds cuDNN compiles a kernel for), v laid out as a step's (a view of the QKV output);
    # the cache is only read.
    calls = []
    causal_call, lse_call = dense_attention._causal, dense_attention.attend_with_lse

    def causal(q, k, v, scale):
        calls.append(("causal", q.shape[2], k.shape[2], v.stride(2)))
        return causal_call(q, k, v, scale)

    def with_lse(q, k, v, scale, causal):
        calls.append(("own keys" if causal else "cached keys", q.shape[2], k.shape[2],
                      v.stride(2)))
        return lse_call(q, k, v, scale, causal)

    gen = torch.Generator().manual_seed(3)
    kv_cache = torch.randn(2, 3, 64, 2, 32, generator=gen).to(DEVICE, torch.float16)
    before = kv_cache.clone()
    with (mock.patch.object(dense_attention, "_causal", causal),
          mock.patch.object(dense_attention, "attend_with_lse", with_lse)):
        timed = dense_attention.warm_up(8, kv_cache, 0.125)
    assert torch.equal(kv_cache, before)
    assert len(timed) == (len(dense_attention.WARM_UP_TOKENS)
                          * len(dense_attention.WARM_UP_CONTEXTS))
    kinds = {(kind, q_len % 64 == 0, k_len % 64 == 0) for kind, q_len, k_len, _ in calls}
    assert kinds == {("causal", True, True),  # a fresh chunk attends in whole tiles, padded
                     ("own keys", True, True), ("own keys", False, False),
                     ("cached keys", True, True), ("cached keys", False, True),
                     ("cached keys", True, False), ("cached keys", False, False)}
    # a fresh chunk in tensors of its own, a chunk after cached keys with v a view of the QKV
    # output
    assert {(q_len, stride) for kind, q_len, _, stride in calls if kind == "causal"} == {
        (512, 2 * 32), (1024, 2 * 32)}
    assert {stride for kind, *_, stride in calls if kind == "own keys"} == {(8 + 2 * 2) * 32}


@device_test
def test_warm_up_builds_the_fresh_chunks_a_step_can_hold():
    lengths = []
    real = dense_attention.dense_prefill_attention

    def spy(q, k, v, kv_cache, meta, scale, out=None):
        if not meta.seq_lens_cpu[0] - meta.max_query_len:  # a fresh chunk
            lengths.append(meta.max_query_len)
        return real(q, k, v, kv_cache, meta, scale, out)

    kv_cache = torch.zeros(2, 3, 64, 2, 32, dtype=torch.float16, device=DEVICE)
    with mock.patch.object(dense_attention, "dense_prefill_attention", spy):
        backend = TritonAttentionBackend(num_layers=32, max_chunk_tokens=1500)
        backend.warm_up(8, kv_cache, [LayerAttention(0.125)])
        # the kinds' 512 and 520 (attended in 1,024), then 1,536
        assert sorted(lengths) == [512, 520, 1536]
        built = {shape for shape, done in backend.fused_shapes.seen.items() if done}
        assert built == {dense_attention.fresh_shape(n, 8, 2, 32, torch.float16)
                         for n in (512, 1024, 1536)}
        lengths.clear()
        dense_attention.warm_up(8, kv_cache, 0.125, 1 << 20)  # at most PREBUILT_TOKENS
        assert max(lengths) == dense_attention.PREBUILT_TOKENS


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_backend_warms_the_fused_path_where_a_layer_can_take_it():
    plain, windowed = LayerAttention(0.125), LayerAttention(0.5, sliding_window=64)
    capped = LayerAttention(0.25, logit_softcap=50.0)
    cache = torch.zeros(2, 1, 16, 2, 32, dtype=torch.float16)
    cases = [(TritonAttentionBackend(), cache, [windowed, plain], 0.125),
             (TritonAttentionBackend(), cache, [windowed, capped], None),
             (TritonAttentionBackend(dense_prefill=False), cache, [plain], None),
             (TritonAttentionBackend(), cache.float(), [plain], None),
             (TritonAttentionBackend(), cache.to(torch.float8_e4m3fn), [plain], None)]
    for backend, kv_cache, layers, scale in cases:
        with mock.patch("hifc.layers.triton_attention.warm_up_fused") as warm:
            backend.warm_up(8, kv_cache, layers)
        assert warm.call_args == (mock.call(8, kv_cache, scale, 0) if scale else None)


def test_fused_kernels_are_taken_once_their_shapes_pay_or_recur():
    shapes = FusedShapes(num_layers=32)
    build_pays = GRAPH_BUILD_SECONDS / SECONDS_SAVED_PER_FLOP / 32  # FLOPs per layer
    assert not shapes.take([("a",)], int(0.5 * build_pays))  # small and new: the paged kernel
    assert shapes.take([("a",)], int(0.5 * build_pays))  # seen before: built now
    assert shapes.take([("a",)], 1)  # built
    assert shapes.take([("b",), ("c",)], int(2.5 * build_pays))  # worth two builds
    assert not shapes.take([("a",), ("d",), ("e",)], int(1.5 * build_pays))  # not two
    assert shapes.take([("d",), ("e",), ("a",)], 1)  # both seen before
    assert FusedShapes(num_layers=1).take([("a",)], int(2 * build_pays)) is False  # one layer
    asked = FusedShapes(num_layers=32)
    assert not asked.pays([("f",)], 1) and not asked.pays([("f",)], 1)  # asking records nothing
    asked.record([("f",)], False)
    assert asked.pays([("f",)], 1) and asked.seen == {("f",): False}


def host_meta(query_lens, context_lens):
    """A step's metadata on the host side only: what the dense-path rules read."""
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    return AttentionMetadata(slot_mapping=None, query_start_loc=None, seq_lens=None,
                             block_tables=None, query_start_loc_cpu=qsl,
                             seq_lens_cpu=seq_lens, max_query_len=max(query_lens),
                             max_seq_len=max(seq_lens), block_size=16)


def test_which_steps_attend_densely():
    def dense(query_lens, context_lens, dtype=torch.bfloat16):
        return dense_chunks_after(host_meta(query_lens, context_lens), dtype, 4096)  # 4 KiB

    assert dense([8192], [0]) == 0
    assert dense([600, 3, 20], [0, 0, 0], torch.float16) == 0
    assert dense([600], [64]) == 0  # a chunk after cached context
    assert dense([1, 1, 600, 7], [9, 300, 0, 40]) == 2  # decodes first
    assert dense([8192], [0], torch.float32) is None  # 16-bit only
    assert dense([600, 1], [0, 300]) is None  # a decode after a chunk
    assert dense([511, 100], [0, 0]) is None  # all short
    assert dense([600] * 9, [0] * 9) is None  # too many chunks
    assert dense([1, 1], [5, 6]) is None  # decodes only
    assert dense([1, 600], [9, 131072]) == 1  # 512 MiB of cached K/V to gather: at the limit
    assert dense([1, 600], [9, 131073]) is None  # past it


def test_which_fresh_chunks_may_attend_densely_apart():
    def suffix(query_lens, context_lens, first=0):
        return fresh_suffix(host_meta(query_lens, context_lens), first)

    assert suffix([1, 1, 40, 600, 530], [300, 90, 700, 0, 0], 2) == 3
    assert suffix([33, 1000], [500, 0]) == 1
    assert suffix([600, 530], [0, 0]) is None  # all fresh: the whole group's rule
    assert suffix([33, 1000, 20], [500, 0, 64]) is None  # not at the step's end
    assert suffix([33, 300, 20], [500, 0, 0]) is None  # all short
    assert suffix([33] + [600] * 9, [500] + [0] * 9) is None  # too many
    assert suffix([33, 600, 1], [500, 0, 0]) is None  # a one-token chunk
