"""Triton paged attention: one kernel for prefill and decode, plus a split-KV (flash-decoding) path.

The kernel follows vLLM's triton unified attention. A program owns one *q block* (BLOCK_Q new
tokens of one sequence) and one KV head; the GROUP query heads that share that KV head are packed
into the tile's M dimension (row m = token m // GROUP, head m % GROUP), so K/V is read once per
group. Keys are gathered through the block table one KV tile (TILE keys) at a time, whatever the
cache block size; the softmax is online, in fp32 and base 2. Query i of a sequence with n new
tokens and context length S sits at position S - n + i and sees keys 0 .. S - n + i, or with a
sliding window W only the last W of them (S - n + i - W + 1 .. S - n + i): tiles left of every
row's window are not visited. With logit soft-capping (cap C) a score s becomes C * tanh(s / C)
before the softmax.

A float8 cache (``torch.float8_e4m3fn``) is read as it is stored, one byte per element. Since a
program sees one KV head, its K scale folds into the score scale and its V scale multiplies the
accumulator once at the end. A 16-bit q is attended in float16: q is converted to float16
(exact for a bfloat16 q within float16's normal range; saturating past it), and so is each
tile (exact: every float8 value is a float16 value), by the hardware's paired conversion,
where converting to bfloat16 would take a float16 -> bfloat16 conversion per element besides.
On the GPU the V tile is converted before the product reads it from shared memory: a float8 V
tile read there in the product's transposed operand layout would be gathered one byte per
load. A float32 q (float32 models) attends in float32 as with a 16-bit cache.

Programs find their sequence by binary search over ``query_start_loc`` (sequence i's q blocks
start at ``query_start_loc[i] // BLOCK_Q + i``), so the grid depends only on T and B and nothing is
built on the host per step (a decode-only step skips the search: q block i is sequence i). With
NUM_SEGMENTS > 1 each program also takes one slice of the KV tiles and writes unnormalised
partials (acc, running max, running sum); a second kernel merges them (in a decode-only launch
of few segments, the last of a sequence's programs for its KV head to finish does:
``merges_in_launch``), and a sequence whose tiles fit one segment is written directly. Slices
are a sequence's tiles over NUM_SEGMENTS but at least SEGMENT_TILES long; a last slice of at
most an eighth of that joins the one before.
Decode batches with too few programs (one per sequence and KV head) to give each SM about
DECODE_PROGRAMS_PER_SM split evenly, when their sequences are few or their even slices no longer
than a balanced segment; larger batches that may hold longer contexts, and crowded ones (too
many programs for two slices each at about DECODE_PROGRAMS_PER_SM per SM), split into segments
of one size, so that programs over the longest contexts do not run alone at the end of the
launch. An evenly split decode-only launch may also rotate q and k by RoPE and write the new
K/V itself (``rotates_in_launch``), instead of the RoPE + KV-write kernel before it. The decodes
a step attends apart from its prompt chunks are planned, and rotated, as the decode CUDA graph of
their padded batch size is (``plan_decodes_as_graphs``), so they compile no variant of their own.

On Hopper GPUs, prompt chunks that this kernel would run in whole 128-row q blocks, unsplit,
attend through a kernel of their own that loads each KV tile by TMA
(:mod:`hifc.layers.triton_prompt_attention`), in 16-bit without a window or soft-capping.

Prompt chunks of at least ``DENSE_PREFILL_MIN_TOKENS`` tokens (after any decodes of the step)
attend through torch's fused kernels instead, cuDNN's first (:mod:`hifc.layers.dense_attention`),
in 16-bit without a window, soft-capping or a float8 cache; the K/V are written to the cache as
always.

Imports on machines without Triton or a GPU; the backend raises there when called.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hifc.layers.attention import (FP8, AttentionMetadata, KeptRows, LayerAttention, Rope,
                                   check_kv_scale, rotate_and_write)
from hifc.layers.dense_attention import (FusedShapes, chunk_call_shapes, dense_chunks_after,
                                         dense_prefill_attention, fresh_shape, fresh_suffix,
                                         padded)
from hifc.layers.dense_attention import warm_up as warm_up_fused

# without Triton (a CPU-only install) this module imports and the backend refuses to run
from hifc.layers import triton_pdl, triton_prompt_attention
from hifc.dtypes import FP8_E4M3_MAX
from hifc.layers.triton_fused import round_to
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import interpreting, tl, triton
from hifc.layers.triton_kv_write import quantize
from hifc.layers.triton_pdl import enter, prefetch_l2
from hifc.layers.triton_prompt_attention import LOG2E, fold_tile, locate_q_block


# Decode batches that fill the GPU split contexts longer than this into segments of at least
# this many keys (a last one of at most an eighth of that joins the one before), at most
# BALANCED_MAX_SEGMENTS of them. 8B shapes on an H200, 32 contexts of
# 4.5k-17.4k tokens: 345-354 us per launch against 401-431 us unsplit; but planned so when all
# contexts are short, a launch is slower (equal 4k contexts: 134 against 125 us), hence a CUDA
# graph per context cap (scripts/gpu_kernel_probe.py --parts balance, docs/RESULTS.md).
BALANCED_SEGMENT_KEYS = 4096
BALANCED_MAX_SEGMENTS = 8
# Steps with prompt chunks and at most MIXED_SPLIT_MAX_TOKENS tokens, whose longest chunk has
# q-block programs for at most 3/4 of the SMs, split contexts longer than BALANCED_SEGMENT_KEYS
# into segments of MIXED_SEGMENT_KEYS keys or more: a short chunk late in a long prompt is a
# few q blocks, each over the whole context. Tokens x segments stay within MIXED_SPLIT_ROWS
# (the partials take tokens x heads x segments x head_dim x 4 bytes). 8B shapes on an H200: a
# 32-token chunk after 32k tokens beside 32 decodes, 914 us unsplit, 209 us in 16 segments; a
# 64-token chunk after 16k alone, 460 -> 79 us (scripts/gpu_kernel_probe.py --parts chunks).
MIXED_SPLIT_MAX_TOKENS = 1024
# Decode batches split their contexts evenly until there are about this many programs per SM:
# 8B shapes, 4k contexts, each launch over its own cache, one H200: batch 1 / 4 / 32 fastest
# in 64 / 16 / 2 segments of 64-key tiles (12.6 / 24.0 / 128.0 us against 17.9 / 25.9 / 134.8
# in 8 / 8 / 1; scripts/gpu_kernel_probe.py --parts decode).
DECODE_PROGRAMS_PER_SM = 4
# ... into at most EVEN_MAX_SEGMENTS, or EVEN_MERGED_SEGMENTS where the launch then merges its
# partials itself (merges_in_launch): 8B shapes on an H100 at 4,096 keys, a batch-1 step took
# 5.60-5.61 ms in 32 segments merged in the launch against 5.64-5.67 in 64 and their merge
# kernel (5.82 in 16), and batch 2's 32 segments merged in the launch 5.98-5.99 ms against
# 6.08-6.10 with the merge kernel (docs/RESULTS.md)
EVEN_MAX_SEGMENTS = 64
EVEN_MERGED_SEGMENTS = 32
MIXED_SEGMENT_KEYS = 2048
MIXED_SPLIT_ROWS = 8192
MIXED_MAX_SEGMENTS = 32
# A decode-only launch whose KV heads' query heads x segments are at most this many partials
# merges them in the program that finishes last, instead of in a merge kernel after it.
MERGE_ROWS = 128


@_jit
def _float8_to_float16(x):
    """float8 e4m3 -> float16, four values per register, by the paired hardware conversion.
    Not a pure operation to the compiler, so that it converts where x is (a tile loaded in
    vectors) instead of after x's move into a dot operand's layout."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
        "cvt.rn.f16x2.e4m3x2 $1, hi; }", "=r,=r,r", [x], dtype=tl.float16, is_pure=False,
        pack=4)


@_jit
def _tanh(x):
    """tanh from exp (the interpreter has no libdevice); saturates to +-1 without NaN."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@_jit
def _attend_tile(q, m_i, l_i, acc, tile, block_row, k_base, v_base, kv_end, first_key, last_key,
                 qk_scale, softcap_log2, stride_k_blk, stride_k_off, stride_v_blk, stride_v_off,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 TILE: tl.constexpr, MASKED: tl.constexpr, SLIDING: tl.constexpr,
                 SOFTCAP: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 FP8_ASM: tl.constexpr):
    """Fold KV tile `tile` into the online softmax. MASKED=False: every row sees every key.

    Rows see keys first_key .. last_key ([M] each; first_key only with SLIDING). Scores are
    q.k * qk_scale in log2 units, or with SOFTCAP tanh(q.k * qk_scale) * softcap_log2. KV_FP8:
    K and V are float8, converted to q's dtype unscaled (the caller applies the scales); with
    FP8_ASM (on the GPU, q in float16) V by ``_float8_to_float16``."""
    offs_t = tl.arange(0, TILE)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    key_pos = tile * TILE + offs_t  # [TILE]
    key_valid = key_pos < kv_end
    if MASKED:
        block = tl.load(block_row + key_pos // BLOCK_SIZE, mask=key_valid, other=0)
    else:
        block = tl.load(block_row + key_pos // BLOCK_SIZE)
    block = block.to(tl.int64)
    in_block = key_pos % BLOCK_SIZE
    k_ptrs = k_base + block[None, :] * stride_k_blk + in_block[None, :] * stride_k_off + offs_d[:, None]
    v_ptrs = v_base + block[:, None] * stride_v_blk + in_block[:, None] * stride_v_off + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=key_valid[None, :] & d_valid[:, None], other=0.0)  # [Dp, TILE]
        v = tl.load(v_ptrs, mask=key_valid[:, None] & d_valid[None, :], other=0.0)  # [TILE, Dp]
    elif HEAD_DIM != HEAD_DIM_PAD:
        k = tl.load(k_ptrs, mask=d_valid[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=d_valid[None, :], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    if KV_FP8:
        k = k.to(q.dtype)
        v = _float8_to_float16(v) if FP8_ASM else v.to(q.dtype)

    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [M, TILE] fp32
    if SOFTCAP:
        s = _tanh(s) * softcap_log2  # log2 units
    if MASKED:
        visible = (key_pos[None, :] <= last_key[:, None]) & key_valid[None, :]
        if SLIDING:
            visible = visible & (key_pos[None, :] >= first_key[:, None])
        s = tl.where(visible, s, float("-inf"))
    return fold_tile(s, v, m_i, l_i, acc, MASKED, DOT_PRECISION)


# Not specialised on the batch (num_seqs) or the block tables' width (stride_bt): Triton would
# compile a variant for 1, for multiples of 16 and for the rest, the first time a step brings
# one (1.7-2.5 s inside a running batch on the H200). Nor on the 16-byte alignment of the
# per-sequence and per-token metadata, read a few entries at a time: a decode graph's live in one
# packed buffer (the block tables 4 bytes past a 16-byte boundary), a mixed step's leading
# decodes in tensors of their own, and both run the same variant.
@_jit(do_not_specialize=["num_seqs", "stride_bt"],
      do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr",
                                      "k_scale_ptr", "v_scale_ptr", "positions_ptr",
                                      "slot_mapping_ptr", "arrivals_ptr"])
def _paged_attention_kernel(
    out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr, segm_count_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, k_scale_ptr, v_scale_ptr,
    positions_ptr, cos_ptr, sin_ptr, k_new_ptr, v_new_ptr, slot_mapping_ptr, arrivals_ptr,
    qk_scale, softcap_log2, window, num_seqs,
    stride_q_t, stride_q_h, stride_o_t, stride_o_h,
    stride_k_blk, stride_k_off, stride_k_head,
    stride_v_blk, stride_v_off, stride_v_head,
    stride_bt, stride_cos, stride_kn_t, stride_kn_h, stride_vn_t, stride_vn_h,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, SEGMENT_TILES: tl.constexpr, DECODE_ONLY: tl.constexpr,
    SLIDING: tl.constexpr, SOFTCAP: tl.constexpr,
    KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
    ROPE: tl.constexpr, MERGE: tl.constexpr, GROUP_PAD: tl.constexpr,
    SEGMENTS_PAD: tl.constexpr, FP8_MAX: tl.constexpr, FP8_ASM: tl.constexpr,
):
    # Later q blocks of a sequence see more keys: hand them out first.
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    if DECODE_ONLY:  # one new token per sequence: q block i is sequence i's token
        seq = q_block
        q_start = q_block
        q_len = 1
        q_block_local = 0
    else:
        seq, q_start, q_len, q_block_local = locate_q_block(query_start_loc_ptr, q_block,
                                                            num_seqs, BLOCK_Q)
        if q_block_local * BLOCK_Q >= q_len:
            return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_pos = q_block_local * BLOCK_Q + offs_m // GROUP  # [M] index among the sequence's new tokens
    head = kv_head * GROUP + offs_m % GROUP  # [M] query head
    row_valid = (offs_m < BLOCK_Q * GROUP) & (q_pos < q_len)
    d_valid = offs_d < HEAD_DIM
    token = (q_start + q_pos).to(tl.int64)  # [M] row in the batch

    last_key = context_len + q_pos  # [M] last key position each row may see
    first_key = last_key - window + 1  # [M] first one (used only with SLIDING)

    # Keys any row of this q block may see: first_tile * TILE .. kv_end - 1. Tiles in
    # [full_lo, full_hi) are seen whole by every row (no masking): from the first one past the
    # last row's window start to the last one before the first row's own position.
    first_q_pos = q_block_local * BLOCK_Q
    last_q_pos = tl.minimum(first_q_pos + BLOCK_Q, q_len) - 1
    kv_end = tl.minimum(seq_len, context_len + first_q_pos + BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE)
    full_hi = (context_len + first_q_pos + 1) // TILE
    if SLIDING:
        first_tile = tl.maximum(context_len + first_q_pos - window + 1, 0) // TILE
        full_lo = tl.cdiv(tl.maximum(context_len + last_q_pos - window + 1, 0), TILE)
    else:
        first_tile = 0
        full_lo = 0
    used_segments = 1
    if NUM_SEGMENTS > 1:
        tiles_per_segment, used_segments = _segments(num_tiles - first_tile, NUM_SEGMENTS,
                                                     SEGMENT_TILES)
        if segment >= used_segments:
            return
        tile_lo = first_tile + segment * tiles_per_segment
        tile_hi = tl.minimum(tile_lo + tiles_per_segment, num_tiles)
        if segment == used_segments - 1:
            tile_hi = num_tiles
    else:
        tile_lo = first_tile
        tile_hi = num_tiles
    # [tile_lo, tile_hi) split into masked [tile_lo, unmasked_lo), whole [unmasked_lo,
    # unmasked_hi), masked [unmasked_hi, tile_hi); empty ranges where a segment has no tiles.
    unmasked_lo = tl.minimum(tl.maximum(full_lo, tile_lo), tile_hi)
    unmasked_hi = tl.minimum(tl.maximum(full_hi, unmasked_lo), tile_hi)

    block_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_k_head
    v_base = v_cache_ptr + kv_head * stride_v_head
    if ROPE:  # a decode step's q and k are not rotated yet, nor its K/V written; the angles
        # and slot come from the step's inputs, read before the wait
        cos, sin = _rope_angles(positions_ptr, cos_ptr, sin_ptr, seq, stride_cos, offs_d,
                                d_valid, HEAD_DIM)
        slot = tl.load(slot_mapping_ptr + seq).to(tl.int64)
    if PDL:  # the step's inputs and earlier steps' K/V are ready: q and this step's K/V not yet
        if DECODE_ONLY:
            _prefetch_tile(tile_lo, block_row, k_base, v_base, kv_end, stride_k_blk,
                           stride_k_off, stride_v_blk, stride_v_off, HEAD_DIM, HEAD_DIM_PAD,
                           BLOCK_SIZE, TILE)
        enter()
    q_offs = token[:, None] * stride_q_t + head[:, None] * stride_q_h + offs_d[None, :]
    q_mask = row_valid[:, None] & d_valid[None, :]
    q = tl.load(q_ptr + q_offs, mask=q_mask, other=0.0)  # [M, Dp]
    if ROPE:
        q = _rope_rotate(q, q_ptr + q_offs, q_mask, offs_d, cos, sin, HEAD_DIM)
        if segment == used_segments - 1:  # the segment ending with the new key writes it
            _write_new_kv(k_new_ptr + seq * stride_kn_t + kv_head * stride_kn_h,
                          v_new_ptr + seq * stride_vn_t + kv_head * stride_vn_h,
                          slot, k_base, v_base, k_scale_ptr + kv_head,
                          v_scale_ptr + kv_head, cos, sin, offs_d, d_valid, stride_k_blk,
                          stride_k_off, stride_v_blk, stride_v_off, HEAD_DIM, BLOCK_SIZE,
                          KV_FP8, FP8_MAX)
            tl.debug_barrier()  # its stores are seen by this program's loads of the last tile
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    if KV_FP8:  # q.(k8 * k_scale) = (q.k8) * k_scale: one scale per program (its KV head)
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
        if q.dtype != tl.float32:  # attended in float16 (module doc)
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)

    for tile in range(tile_lo, unmasked_lo):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, tile, block_row, k_base, v_base, kv_end,
                                     first_key, last_key, qk_scale, softcap_log2, stride_k_blk,
                                     stride_k_off, stride_v_blk, stride_v_off, HEAD_DIM,
                                     HEAD_DIM_PAD, BLOCK_SIZE, TILE, True, SLIDING, SOFTCAP,
                                     KV_FP8, DOT_PRECISION, FP8_ASM)
    for tile in range(unmasked_lo, unmasked_hi):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, tile, block_row, k_base, v_base, kv_end,
                                     first_key, last_key, qk_scale, softcap_log2, stride_k_blk,
                                     stride_k_off, stride_v_blk, stride_v_off, HEAD_DIM,
                                     HEAD_DIM_PAD, BLOCK_SIZE, TILE, False, SLIDING, SOFTCAP,
                                     KV_FP8, DOT_PRECISION, FP8_ASM)
    for tile in range(unmasked_hi, tile_hi):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, tile, block_row, k_base, v_base, kv_end,
                                     first_key, last_key, qk_scale, softcap_log2, stride_k_blk,
                                     stride_k_off, stride_v_blk, stride_v_off, HEAD_DIM,
                                     HEAD_DIM_PAD, BLOCK_SIZE, TILE, True, SLIDING, SOFTCAP,
                                     KV_FP8, DOT_PRECISION, FP8_ASM)

    if KV_FP8:  # p @ (v8 * v_scale) = (p @ v8) * v_scale; partials merge linearly
        acc = acc * tl.load(v_scale_ptr + kv_head)
    if NUM_SEGMENTS > 1 and not MERGE and segment == 0:  # how many partials a row has, for
        # the merge kernel
        tl.store(segm_count_ptr + token, tl.full([BLOCK_M], 1, tl.int32) * used_segments,
                 mask=row_valid)
    if used_segments == 1:
        # padding rows past the sequence's new tokens may see no key (l_i 0): never stored
        out = acc / tl.where(row_valid, l_i, 1.0)[:, None]
        o_offs = token[:, None] * stride_o_t + head[:, None] * stride_o_h + offs_d[None, :]
        tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty),
                 mask=row_valid[:, None] & d_valid[None, :])
    else:
        part = (token * NUM_Q_HEADS + head) * NUM_SEGMENTS + segment  # [M]
        tl.store(segm_max_ptr + part, m_i, mask=row_valid)
        tl.store(segm_sum_ptr + part, l_i, mask=row_valid)
        tl.store(segm_out_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc,
                 mask=row_valid[:, None])
        if MERGE:  # the last of the sequence's segments (for this KV head) to finish merges
            tl.debug_barrier()  # every thread's partials stored before the release below
            arrivals = arrivals_ptr + seq * tl.num_programs(1) + kv_head
            if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == used_segments - 1:
                tl.store(arrivals, 0)  # zero again for the next launch
                _merge_in_program(out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr, seq,
                                  kv_head, used_segments, stride_o_t, stride_o_h, NUM_Q_HEADS,
                                  GROUP, GROUP_PAD, HEAD_DIM, HEAD_DIM_PAD, NUM_SEGMENTS,
                                  SEGMENTS_PAD)


@_jit
def _rope_angles(positions_ptr, cos_ptr, sin_ptr, token, stride_cos, offs_d, d_valid,
                 HEAD_DIM: tl.constexpr):
    """cos and sin ([Dp], float32) of the token's position for each dimension of a head: the
    angle of dimension d is that of d mod HEAD_DIM / 2 (rotate-half RoPE)."""
    half: tl.constexpr = HEAD_DIM // 2
    pair = tl.where(offs_d < half, offs_d, offs_d - half)
    at = tl.load(positions_ptr + token).to(tl.int64) * stride_cos + pair
    cos = tl.load(cos_ptr + at, mask=d_valid, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + at, mask=d_valid, other=0.0).to(tl.float32)
    return cos, sin


@_jit
def _rope_rotate(x, ptrs, mask, offs_d, cos, sin, HEAD_DIM: tl.constexpr):
    """Rotate-half RoPE of x (loaded from ptrs; last dimension offs_d, one head), rounded as
    ``triton_fused.rotated_heads`` rounds it: dimension d pairs with d +- HEAD_DIM / 2."""
    half: tl.constexpr = HEAD_DIM // 2
    first = offs_d < half
    partner = tl.load(ptrs + tl.where(first, half, -half), mask=mask, other=0.0)
    a = round_to(x.to(tl.float32) * cos, x.dtype)
    b = round_to(partner.to(tl.float32) * sin, x.dtype)
    return tl.where(first, a - b, a + b).to(x.dtype)


@_jit
def _write_new_kv(k_ptr, v_ptr, slot, k_base, v_base, k_scale_ptr, v_scale_ptr, cos, sin,
                  offs_d, d_valid, stride_k_blk, stride_k_off, stride_v_blk, stride_v_off,
                  HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, KV_FP8: tl.constexpr,
                  FP8_MAX: tl.constexpr):
    """Rotate one head's new key (k_ptr) and write it and its value (v_ptr) into the cache at
    the token's slot, as ``rotary_write_kv_cache`` writes them; a negative slot is skipped."""
    if slot >= 0:
        k = tl.load(k_ptr + offs_d, mask=d_valid, other=0.0)
        k = _rope_rotate(k, k_ptr + offs_d, d_valid, offs_d, cos, sin, HEAD_DIM)
        v = tl.load(v_ptr + offs_d, mask=d_valid, other=0.0)
        if KV_FP8:
            k = quantize(k, tl.load(k_scale_ptr), FP8_MAX)
            v = quantize(v, tl.load(v_scale_ptr), FP8_MAX)
        block = slot // BLOCK_SIZE
        in_block = slot % BLOCK_SIZE
        tl.store(k_base + block * stride_k_blk + in_block * stride_k_off + offs_d, k,
                 mask=d_valid)
        tl.store(v_base + block * stride_v_blk + in_block * stride_v_off + offs_d, v,
                 mask=d_valid)


@_jit
def _merge_in_program(out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr, token, kv_head, used,
                      stride_o_t, stride_o_h, NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr,
                      GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      HEAD_DIM_PAD: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
                      SEGMENTS_PAD: tl.constexpr):
    """Merge the `used` partials of a decode token's GROUP query heads of one KV head, all at
    once, as ``_merge_segments_kernel`` merges a head's, and store its output. The partials
    were written by other programs: loaded past L1."""
    offs_g = tl.arange(0, GROUP_PAD)
    offs_s = tl.arange(0, SEGMENTS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    g_ok = offs_g < GROUP
    head = kv_head * GROUP + offs_g  # [G]
    part = ((token.to(tl.int64) * NUM_Q_HEADS + head) * NUM_SEGMENTS)[:, None] + offs_s[None, :]
    seen = g_ok[:, None] & (offs_s < used)[None, :]  # [G, S]
    m = tl.load(segm_max_ptr + part, mask=seen, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(segm_sum_ptr + part, mask=seen, other=0.0, cache_modifier=".cg")
    acc = tl.load(segm_out_ptr + part[:, :, None] * HEAD_DIM_PAD + offs_d[None, None, :],
                  mask=seen[:, :, None], other=0.0, cache_modifier=".cg")  # [G, S, Dp]
    # finite on a head's rows: the segment holding the token's own key saw it
    m_all = tl.where(g_ok, tl.max(m, axis=1), 0.0)  # [G]
    w = tl.exp2(m - m_all[:, None])  # slots past `used` weigh 0
    total = tl.where(g_ok, tl.sum(sums * w, axis=1), 1.0)
    out = tl.sum(acc * w[:, :, None], axis=1) / total[:, None]
    tl.store(out_ptr + token * stride_o_t + head[:, None] * stride_o_h + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


@_jit
def _prefetch_tile(tile, block_row, k_base, v_base, kv_end, stride_k_blk, stride_k_off,
                   stride_v_blk, stride_v_off, HEAD_DIM: tl.constexpr,
                   HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """Prefetch KV tile `tile` (its keys before kv_end) of one KV head into L2: each key's
    lines that start inside its head."""
    key_pos = tile * TILE + tl.arange(0, TILE)
    key_valid = key_pos < kv_end
    block = tl.load(block_row + key_pos // BLOCK_SIZE, mask=key_valid, other=0).to(tl.int64)
    in_block = key_pos % BLOCK_SIZE
    per_line: tl.constexpr = 1024 // k_base.dtype.element_ty.primitive_bitwidth  # 128 bytes
    LINES: tl.constexpr = (HEAD_DIM_PAD + per_line - 1) // per_line  # a key's head, in lines
    offs = tl.arange(0, LINES)[None, :] * per_line
    mask = key_valid[:, None] & (offs < HEAD_DIM)
    prefetch_l2(k_base + block[:, None] * stride_k_blk + in_block[:, None] * stride_k_off + offs,
                mask)
    prefetch_l2(v_base + block[:, None] * stride_v_blk + in_block[:, None] * stride_v_off + offs,
                mask)


@_jit
def _segments(span, NUM_SEGMENTS: tl.constexpr, SEGMENT_TILES: tl.constexpr):
    """How a q block's span tiles split: (tiles per segment, segments used). Slices of the span
    over NUM_SEGMENTS but at least SEGMENT_TILES long: with a large minimum, segments have one
    size in every sequence (short ones use fewer), so programs carry similar work whatever the
    sequences' lengths. A last slice of at most an eighth of a segment joins the one before
    rather than cost a program and a merge of its own."""
    per = tl.maximum(tl.cdiv(span, NUM_SEGMENTS), SEGMENT_TILES)
    used = tl.cdiv(span, per)
    if (used > 1) & (span - (used - 1) * per <= per // 8):
        used -= 1
    return per, used


@_jit
def _merge_segments_kernel(
    out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr, segm_count_ptr,
    stride_o_t, stride_o_h,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, SEGMENTS_PAD: tl.constexpr, PRELOAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Merge a row's partials. PRELOAD (rows that mostly have several): load every slot's
    partial at once, not after the count, then mask the slots past it (one trip to memory
    instead of two)."""
    if PDL:
        enter()
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SEGMENTS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    part = (token * NUM_Q_HEADS + head) * NUM_SEGMENTS + offs_s  # [S]
    acc_ptrs = segm_out_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :]
    used = tl.load(segm_count_ptr + token)
    if PRELOAD:  # slots past `used` hold stale values (any bits): masked after the loads
        slots = offs_s < NUM_SEGMENTS
        m = tl.load(segm_max_ptr + part, mask=slots, other=float("-inf"))
        sums = tl.load(segm_sum_ptr + part, mask=slots, other=0.0)
        acc = tl.load(acc_ptrs, mask=slots[:, None] & d_valid[None, :], other=0.0)  # [S, Dp]
    if used == 1:  # the attention kernel wrote this row's output itself
        return
    s_valid = offs_s < used
    if PRELOAD:
        m = tl.where(s_valid, m, float("-inf"))
        sums = tl.where(s_valid, sums, 0.0)
        acc = tl.where(s_valid[:, None], acc, 0.0)
    else:
        m = tl.load(segm_max_ptr + part, mask=s_valid, other=float("-inf"))
        sums = tl.load(segm_sum_ptr + part, mask=s_valid, other=0.0)
        acc = tl.load(acc_ptrs, mask=s_valid[:, None] & d_valid[None, :], other=0.0)
    m_all = tl.max(m, axis=0)  # finite: the segment holding the row's own key saw it
    w = tl.exp2(m - m_all)  # segments that no key of this row reached (max -inf) weigh 0
    total = tl.sum(sums * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / total
    tl.store(out_ptr + token * stride_o_t + head * stride_o_h + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=d_valid)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def rotates_in_launch(plan: LaunchPlan) -> bool:
    """Whether a decode-only step's attention launch under ``plan`` also rotates q and k and
    writes the new K/V (``paged_attention``'s rope) instead of a RoPE + KV-write kernel before
    it: in even splits, whose programs read a few tiles each, so that the kernel's launch
    weighs more than the rotation does at their start. 8B shapes on an H200, a decode layer
    with its projections at 4k contexts, in the launch against the kernel: batch 1 41.6 / 42.4
    us, batch 4 52.8 / 56.1, batch 32 159.4 / 161.3; a program over a whole context (batch
    128, no split) 542.2 / 538.9, over a balanced segment (batch 32, 4,190-key cap) 175.3 /
    166.4 (docs/RESULTS.md)."""
    return plan.num_segments > 1 and plan.segment_tiles == 1


def merges_in_launch(num_segments: int, group: int) -> bool:
    """Whether a split decode-only launch merges its partials itself: when a KV head's query
    heads x segments (padded) are at most MERGE_ROWS, which the merging program loads at once.
    The last program of a sequence's KV head to finish merges (counted in the arrival counters),
    saving the merge kernel's launch: 8B shapes on an H200, a decode layer (QKV projection,
    attention, O projection) at batch 4 (16 segments) took 54.7 us against 57.2 with the merge
    kernel; at batch 1, 64 segments merged in four loads one after another took 46.4 against
    41.8; on an H100, 32 segments merged in one load shortened batch 1's steps (see
    EVEN_MERGED_SEGMENTS; docs/RESULTS.md)."""
    return num_segments > 1 and _next_pow2(group) * _next_pow2(num_segments) <= MERGE_ROWS


# Each device's segment-arrival counters of in-kernel merges, all zero between launches (the
# merging program zeroes its own); every buffer is kept, as CUDA graphs captured with it hold
# its address.
_arrival_buffers: dict[torch.device, list[torch.Tensor]] = {}
ARRIVALS_MIN = 1 << 16


def _arrivals(device: torch.device, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters on device (one per decode token and KV head)."""
    buffers = _arrival_buffers.setdefault(device, [])
    if not buffers or buffers[-1].numel() < n:
        buffers.append(torch.zeros(max(n, ARRIVALS_MIN), dtype=torch.int32, device=device))
    return buffers[-1]


def _new_kv_operands(rope: Rope | None, q: torch.Tensor, k: torch.Tensor | None,
                     v: torch.Tensor | None, kv_cache: torch.Tensor, meta: AttentionMetadata,
                     decode_only: bool) -> tuple:
    """The kernel's positions, cos, sin, new k and v and slot-mapping operands, then its cos
    stride and k and v strides: rope's, checked, or stand-ins when there is no rope."""
    if rope is None:
        return (q,) * 6 + (0,) * 5
    if not decode_only:
        raise ValueError("rotating q and k in the attention launch takes a decode-only step")
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if k is None or v is None or k.shape != v.shape or k.shape != (q.shape[0], num_kv_heads,
                                                                    head_dim):
        raise ValueError("rope needs the step's new k and v, [T, Hkv, D] each")
    if head_dim % 2:
        raise ValueError(f"rotate-half RoPE needs an even head_dim, got {head_dim}")
    cos, sin = rope.rotary.cos_cache, rope.rotary.sin_cache
    if cos.stride(-1) != 1 or cos.stride() != sin.stride() or cos.shape[-1] != head_dim // 2:
        raise ValueError("cos_cache and sin_cache must be alike [P, D/2], contiguous last dim")
    k, v, positions = (t if t.stride(-1) == 1 else t.contiguous()
                       for t in (k, v, rope.positions))
    return (positions, cos, sin, k, v, meta.slot_mapping, cos.stride(0), k.stride(0),
            k.stride(1), v.stride(0), v.stride(1))


@dataclass(frozen=True)
class LaunchPlan:
    """Tile shapes and split for one call (all compile-time constants of the kernel)."""

    block_m: int  # rows of a program's tile: block_q tokens x group query heads (padded)
    block_q: int  # new tokens per program
    tile: int  # keys per KV tile
    num_segments: int  # 1: one pass; >1: split-KV partials plus a merge kernel
    num_warps: int
    num_stages: int
    # with num_segments > 1, the fewest KV tiles per segment: a sequence uses as many segments
    # as its tiles fill, at most num_segments (1: every sequence uses them all); a last one of
    # at most an eighth of a segment joins the one before
    segment_tiles: int = 1


def plan_launch(max_query_len: int, max_seq_len: int, num_seqs: int, num_q_heads: int,
                num_kv_heads: int, head_dim: int, elem_size: int, num_sms: int,
                split_kv: bool | None = None, num_tokens: int = 0) -> LaunchPlan:
    """Choose tile shapes. split_kv: None = split decode-only batches that underfill the GPU
    (evenly, into about DECODE_PROGRAMS_PER_SM programs per SM), that may hold long contexts
    (evenly while the slices are at most BALANCED_SEGMENT_KEYS keys) or that are crowded (too
    many programs for two slices each at about that many per SM: into balanced segments), and
    steps of at most
    MIXED_SPLIT_MAX_TOKENS tokens (0: take max_query_len x num_seqs) with prompt chunks and
    long contexts (into segments of BALANCED_SEGMENT_KEYS or MIXED_SEGMENT_KEYS keys or more);
    True / False force a split on or off."""
    group = num_q_heads // num_kv_heads
    head_dim_pad = _next_pow2(head_dim)
    max_block_m = MAX_BLOCK_M if head_dim_pad <= 128 else MAX_BLOCK_M // 2
    block_m = min(max_block_m, max(16, _next_pow2(max_query_len * group)))
    block_m = max(block_m, 16, _next_pow2(group))
    block_q = block_m // group
    # Tile shapes measured on an H200 (docs/RESULTS.md, "Triton paged attention (issue 2)").
    if elem_size > 2 and head_dim_pad > 128:
        # float32 with Gemma 2's head_dim 256: half the tile keeps two stages of K and V (and
        # the q tile) well inside an SM's shared memory
        tile, num_warps, num_stages = 16, 4, 2
    elif elem_size > 2 or head_dim_pad > 128:
        tile, num_warps, num_stages = 32, 4 if block_m <= 64 else 8, 2
    elif block_m >= 128:
        tile, num_warps, num_stages = 128, 8, 2  # prefill 8k: 1533 us; tile 64: 1709 us
    elif max_query_len == 1:
        # Decode: 64-key tiles, except in balanced segments (below). 8B shapes on one H200,
        # attention per step in the engine, split as below: batch 4 at 4k contexts 0.81 ms
        # against 0.99 with 128-key tiles in about one program per SM; batch 1 / 32 at 2k
        # 0.37 / 2.25 against 0.39 / 2.27 (docs/RESULTS.md)
        tile, num_warps, num_stages = 64, 4, 2
    else:  # prompt chunks of a few tokens
        tile, num_warps, num_stages = 128, 4, 2
    num_segments, segment_tiles = 1, 1
    programs = num_seqs * num_kv_heads
    few = 2 * programs <= num_sms
    # too many programs for an even split to give each about DECODE_PROGRAMS_PER_SM per SM
    crowded = 2 * programs > DECODE_PROGRAMS_PER_SM * num_sms
    # an even split into about DECODE_PROGRAMS_PER_SM programs per SM, segments of a tile or more,
    # fewer where that lets the launch merge its partials itself
    cap = (EVEN_MERGED_SEGMENTS if merges_in_launch(EVEN_MERGED_SEGMENTS, group)
           else EVEN_MAX_SEGMENTS)
    even = min(DECODE_PROGRAMS_PER_SM * num_sms // programs, max_seq_len // tile, cap)
    auto = split_kv is None
    if auto:
        # Split a decode batch whose programs (one per sequence and KV head) would leave SMs
        # short of programs (at B=1, 4x faster), or that may hold contexts longer than one
        # balanced segment, or that is crowded (into balanced segments, which contexts up to
        # BALANCED_SEGMENT_KEYS fill one of: 8B shapes on an H200 at 4,096 keys, per decode
        # layer with its projections, batch 64 280.1 us against 297.7 unsplit, batch 128
        # 519.3-520.7 against 541.9-585.7: the same work, compiled to other code)
        if max_query_len == 1:
            split_kv = even >= 2 or max_seq_len > BALANCED_SEGMENT_KEYS or crowded
        else:
            # ... and a longest chunk whose q blocks leave SMs idle (a 512-token chunk of the 8B
            # preset, 128 programs, ran alone in 133 us unsplit against 181 us split)
            chunk_programs = -(-max_query_len * group // block_m) * num_kv_heads
            split_kv = (max_seq_len > BALANCED_SEGMENT_KEYS and 4 * chunk_programs <= 3 * num_sms
                        and (num_tokens or max_query_len * num_seqs) <= MIXED_SPLIT_MAX_TOKENS)
    # equal slices of each sequence; a power of two bounds the compiled variants
    even_segments = 1 << (max(2, even).bit_length() - 1)
    if split_kv and auto and max_query_len > 1:
        # A step with prompt chunks (whose q blocks are more programs than its sequences):
        # segments of MIXED_SEGMENT_KEYS keys, as many as the longest context fills, within the
        # partials' rows.
        rows = MIXED_SPLIT_ROWS // (num_tokens or max_query_len * num_seqs)
        want = min(1 << (-(-max_seq_len // MIXED_SEGMENT_KEYS) - 1).bit_length(),
                   1 << max(0, rows.bit_length() - 1), MIXED_MAX_SEGMENTS)
        num_segments = max(2, want)
        segment_tiles = max(1, MIXED_SEGMENT_KEYS // tile)
    elif split_kv and (few or (auto and not crowded
                               and even_segments * BALANCED_SEGMENT_KEYS >= max_seq_len)):
        # ... and uncrowded batches whose even slices are no longer than balanced segments,
        # also past BALANCED_SEGMENT_KEYS (8B shapes on an H200, batch 32 at 4,100 keys under a
        # 4,190-key cap: 157.8-160.7 us per decode layer with its projections against
        # 164.5-170.4 in balanced segments)
        num_segments = even_segments
    elif split_kv:
        # Many programs: segments of one size (a sequence uses as many as its length fills), so
        # a step's longest contexts do not leave their programs running alone at its end.
        # Decode: 128-key tiles unless crowded (32 sequences of 4k keys took 4.43 ms per step
        # against 4.82 with 64), 64-key tiles then (128 sequences at 4,100 keys: 523.7-524.6 us
        # per layer against 539.2-549.8; 64 at 4,096: 280.1 against 306.8)
        want = max(2, min(-(-max_seq_len // BALANCED_SEGMENT_KEYS), BALANCED_MAX_SEGMENTS))
        num_segments = 1 << (want - 1).bit_length()
        if max_query_len == 1 and tile == 64 and not crowded:
            tile = 128
        segment_tiles = max(1, BALANCED_SEGMENT_KEYS // tile)
    if max_query_len == 1 and segment_tiles == 1 and num_segments * tile >= max_seq_len:
        # a decode program reads one tile: nothing to pipeline, and a second stage's shared
        # memory only keeps programs off the SMs (8B shapes on an H200, batch 1 at 4k in 64
        # segments: 42.3 against 44.0 us per decode layer with its projections)
        num_stages = 1
    return LaunchPlan(block_m, block_q, tile, num_segments, num_warps, num_stages, segment_tiles)


# prompt chunks of a tile's full rows: the largest q block a chunk's plan takes (plan_launch)
MAX_BLOCK_M = 128


def warm_up_shapes() -> list[tuple[int, int]]:
    """(cached context, new tokens) of prompt chunks that reach every launch variant a first
    prompt chunk of a 16-bit model can take: chunks of 2, 4, ... MAX_BLOCK_M tokens (a chunk's
    q block follows its tokens x query heads per KV head, in powers of two), fresh and after
    BALANCED_SEGMENT_KEYS, twice that, ... cached keys, up to the context whose
    MIXED_SEGMENT_KEYS segments number MIXED_MAX_SEGMENTS (each q block with each count of
    segments is a variant of the kernel, each count a variant of its merge)."""
    chunks = [1 << i for i in range(1, MAX_BLOCK_M.bit_length())]
    contexts = [0]
    context = BALANCED_SEGMENT_KEYS
    while context < MIXED_MAX_SEGMENTS * MIXED_SEGMENT_KEYS:
        contexts.append(context)
        context *= 2
    return [(context, n) for context in contexts for n in chunks]


class TritonAttentionBackend:
    """Paged attention on CUDA through Triton; same contract as TorchAttentionBackend.

    split_kv: None (default) splits the KV sequence across programs as ``plan_launch`` says;
    True/False force it on/off (any batch works either way).
    triton_kv_write: scatter the new K/V with the fused Triton kernel instead of torch.
    dense_prefill: long prompt chunks through torch's fused kernels
    (:mod:`hifc.layers.dense_attention`): None (default) when they pay for their new shapes
    over ``num_layers`` layers, True always, False never.
    max_chunk_tokens: the most tokens a step holds, up to which start-up's ``warm_up`` builds
    the fused kernels' graphs of fresh chunks.
    """

    def __init__(self, split_kv: bool | None = None, triton_kv_write: bool = True,
                 dense_prefill: bool | None = None, num_layers: int = 1,
                 max_chunk_tokens: int = 0):
        if triton is None:
            raise RuntimeError("TritonAttentionBackend needs the triton package (and a CUDA GPU)")
        self.split_kv = split_kv
        self.triton_kv_write = triton_kv_write
        self.dense_prefill = dense_prefill
        self.max_chunk_tokens = max_chunk_tokens
        self.fused_shapes = FusedShapes(num_layers)
        # this step's choice: (its metadata, (leading decodes, first fused sequence))
        self._dense: tuple[AttentionMetadata, tuple[int | None, int | None]] | None = None
        # (id of a step's metadata or of a part of it, split) -> (that metadata, the
        # metadata of its sequences before the split and of those after)
        self._apart: dict[tuple[int, int], tuple[AttentionMetadata, AttentionMetadata,
                                                 AttentionMetadata]] = {}
        # the decode CUDA graphs' batch sizes and each one's context caps
        # (plan_decodes_as_graphs)
        self._graph_batches: list[int] = []
        self._graph_caps: dict[int, list[int]] = {}

    def num_sms(self, device: torch.device) -> int:
        return triton_pdl.sm_count(device) if device.type == "cuda" else 1

    def plan(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
             sliding_window: int | None = None) -> LaunchPlan:
        return self._plan(q, kv_cache, meta.max_query_len, meta.max_seq_len, meta.num_seqs,
                          q.shape[0], sliding_window)

    def _plan(self, q: torch.Tensor, kv_cache: torch.Tensor, max_query_len: int,
              max_seq_len: int, num_seqs: int, num_tokens: int,
              sliding_window: int | None) -> LaunchPlan:
        # a query with a window reads at most sliding_window keys, its q block a few more
        max_keys = (max_seq_len if sliding_window is None else
                    min(max_seq_len, sliding_window + max_query_len))
        return plan_launch(max_query_len, max_keys, num_seqs, q.shape[1], kv_cache.shape[-2],
                           q.shape[2], q.element_size(), self.num_sms(q.device), self.split_kv,
                           num_tokens=num_tokens)

    def graph_context_caps(self, max_model_len: int) -> list[int]:
        """The contexts the CUDA graphs of decodes beside a prompt chunk are planned for,
        ascending: steps whose sequences all fit BALANCED_SEGMENT_KEYS replay a graph without
        the balanced split."""
        if self.split_kv is not None or max_model_len <= BALANCED_SEGMENT_KEYS:
            return [max_model_len]
        return [BALANCED_SEGMENT_KEYS, max_model_len]

    def plan_decodes_as_graphs(self, batch_sizes: list[int], max_model_len: int,
                               num_q_heads: int, kv_cache: torch.Tensor,
                               dtype: torch.dtype) -> dict[int, list[int]]:
        """Plan the decodes a step attends apart from its prompt chunks as the decode CUDA
        graph of their padded batch size (the smallest of ``batch_sizes`` that holds them) and
        context cap does, and rotate them in that launch where the graph does: they run kernel
        variants the graphs compiled at capture, instead of one of their own, compiled the first
        time a step brings its count of decodes and context (1.8 s inside a running batch on
        the H200). ``num_q_heads``, ``kv_cache`` (one layer's) and ``dtype`` (q's) are the
        model's attention shapes. Returns each batch size's decode graph caps
        (``_decode_graph_caps``)."""
        shape = (num_q_heads, kv_cache.shape[-2], kv_cache.shape[-1], dtype.itemsize,
                 self.num_sms(kv_cache.device))
        self._graph_batches = sorted(batch_sizes)
        self._graph_caps = {b: self._decode_graph_caps(b, max_model_len, shape)
                            for b in batch_sizes}
        return dict(self._graph_caps)

    def _decode_graph_caps(self, batch: int, max_model_len: int,
                           shape: tuple[int, int, int, int, int]) -> list[int]:
        """The context caps of batch size ``batch``'s decode graphs, ascending (``shape``:
        plan_launch's query heads, KV heads, head size, q's element size and SMs): the short
        cap of ``graph_context_caps`` stretched to the longest power-of-two multiple of it
        below max_model_len that plans as it does, then max_model_len (alone where it plans as
        the short cap). An uncrowded batch splits its contexts evenly up to the short cap x
        its even split's segments, where max_model_len plans one balanced segment per sequence
        and KV head for a context just past the short cap: 8B shapes on an H100 at 4,100 keys
        under a 131,072-key max_model_len, a step of batch 16 / 32 took 8.68 / 11.95 ms
        against 9.30 / 12.15 (docs/RESULTS.md)."""
        caps = self.graph_context_caps(max_model_len)
        if len(caps) == 1:
            return caps

        def plan(cap: int) -> LaunchPlan:
            return plan_launch(1, cap, batch, *shape, self.split_kv)

        short = plan(caps[0])
        if plan(max_model_len) == short:
            return [max_model_len]
        cap = caps[0]
        while 2 * cap < max_model_len and plan(2 * cap) == short:
            cap *= 2
        return [cap, max_model_len]

    def warm_up_shapes(self) -> list[tuple[int, int]]:
        return warm_up_shapes()

    def warm_up(self, num_q_heads: int, kv_cache: torch.Tensor,
                layers: Sequence[LayerAttention]) -> None:
        """Where a layer can take the fused prompt path (a 16-bit cache, the path allowed, a
        layer without a window or soft-capping), meet its kinds of call
        (``dense_attention.warm_up``): cuDNN's kernels and the merge kernel, whose first use is
        otherwise a request's chunk once its shape recurs; and build the graphs of fresh chunks
        up to ``max_chunk_tokens``, recorded as built."""
        fused = next((layer for layer in layers
                      if self._fused_allowed(layer.sliding_window, layer.logit_softcap,
                                             kv_cache)), None)
        if fused is not None:
            timed = warm_up_fused(num_q_heads, kv_cache, fused.scale, self.max_chunk_tokens)
            _, _, _, num_kv_heads, head_dim = kv_cache.shape
            self.fused_shapes.record([fresh_shape(padded(n), num_q_heads, num_kv_heads, head_dim,
                                                  kv_cache.dtype)
                                      for context, n, _ in timed if not context], True)

    def _fused_allowed(self, sliding_window: int | None, logit_softcap: float | None,
                       kv_cache: torch.Tensor) -> bool:
        """Whether a layer's prompt chunks may take the fused path at all (``dense_prefill``
        not off, no window, no soft-capping, a 16-bit cache); ``dense_chunks_after`` and
        ``FusedShapes`` then decide step by step."""
        return (self.dense_prefill is not False and sliding_window is None
                and logit_softcap is None and kv_cache.dtype in (torch.bfloat16, torch.float16))

    def _decodes_plan(self, q: torch.Tensor, kv_cache: torch.Tensor, decodes: AttentionMetadata,
                      sliding_window: int | None) -> LaunchPlan:
        """The launch plan of a step's leading decodes (``decodes``: their metadata, which
        keeps the step's max_seq_len): a decode graph's (``plan_decodes_as_graphs``) where one
        holds them, else their own."""
        n = decodes.num_seqs
        i = bisect.bisect_left(self._graph_batches, n)
        batch = self._graph_batches[i] if i < len(self._graph_batches) else None
        cap = (None if batch is None else
               next((c for c in self._graph_caps[batch] if c >= decodes.max_seq_len), None))
        if cap is None:
            return self.plan(q[:n], kv_cache, decodes, sliding_window)
        return self._plan(q, kv_cache, 1, cap, batch, batch, sliding_window)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                logit_softcap: float | None = None, kv_scale: torch.Tensor | None = None,
                out: torch.Tensor | None = None, *, rope: Rope | None = None) -> torch.Tensor:
        """Write k, v ([T, Hkv, D]) into kv_cache, then return attention of q ([T, Hq, D]).
        kv_scale: the K and V scales ([2, Hkv] float32) of a float8 cache, else None. rope: q
        and k are not rotated yet (with the Triton KV write, rotated in its launch; in a
        decode-only step, and in the launch of a step's leading decodes attended apart, where
        their plan is an even split, in the attention's launch, which also writes k and v)."""
        whole_step_plan = None  # a decode-only step's, planned once
        if (rope is not None and self.triton_kv_write and meta.max_query_len == 1
                and q.shape[0] == meta.num_seqs):
            whole_step_plan = self.plan(q, kv_cache, meta, sliding_window)
            if rotates_in_launch(whole_step_plan):
                return paged_attention(q, kv_cache, meta, scale, whole_step_plan, out,
                                       sliding_window, logit_softcap, kv_scale, rope=rope, k=k,
                                       v=v)
        decodes, dense = (self._dense_chunks_after(q, k, v, meta)
                          if self._fused_allowed(sliding_window, logit_softcap, kv_cache)
                          else (None, None))
        # a tile of the chunks' shape would run each decode row at 1/BLOCK_Q of its rows
        if decodes is None:
            decodes = meta.num_leading_decodes
        apart = 0 < decodes < meta.num_seqs
        if apart:
            first, rest = self._apart_metas(meta, decodes)
            first_plan = self._decodes_plan(q, kv_cache, first, sliding_window)
        # the leading decodes rotate q and k and write their K/V in their own launch where
        # their plan does so in a decode step (the kernel variant the decode graphs run)
        rotated_apart = (apart and rope is not None and self.triton_kv_write
                         and rotates_in_launch(first_plan))
        rows = slice(decodes if rotated_apart else 0, None)  # those the step writes here
        v_rest = v[rows]
        q_rest, k_rest = self._write_new_kv(
            q[rows], k[rows], v_rest, kv_cache, meta.slot_mapping[rows], kv_scale,
            None if rope is None else Rope(rope.rotary, rope.positions[rows]))
        if not apart and (dense is None or dense == 0):
            if dense is not None:
                return dense_prefill_attention(q_rest, k_rest, v_rest, kv_cache, meta, scale, out)
            return paged_attention(q_rest, kv_cache, meta, scale,
                                   whole_step_plan or self.plan(q, kv_cache, meta, sliding_window),
                                   out, sliding_window, logit_softcap, kv_scale)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if not apart:
            rest = meta
        elif rotated_apart:
            paged_attention(q[:decodes], kv_cache, first, scale, first_plan, out[:decodes],
                            sliding_window, logit_softcap, kv_scale,
                            rope=Rope(rope.rotary, rope.positions[:decodes]), k=k[:decodes],
                            v=v[:decodes])
        else:
            paged_attention(q_rest[:decodes], kv_cache, first, scale, first_plan, out[:decodes],
                            sliding_window, logit_softcap, kv_scale)
            q_rest, k_rest, v_rest = q_rest[decodes:], k_rest[decodes:], v_rest[decodes:]
        rest_out = out[decodes:]
        if dense is not None and dense > decodes:  # chunks before the fresh ones: paged
            chunks, rest = self._apart_metas(rest, dense - decodes)
            t = chunks.query_start_loc_cpu[-1]
            paged_attention(q_rest[:t], kv_cache, chunks, scale,
                            self.plan(q_rest[:t], kv_cache, chunks, sliding_window), rest_out[:t],
                            sliding_window, logit_softcap, kv_scale)
            q_rest, k_rest, v_rest, rest_out = q_rest[t:], k_rest[t:], v_rest[t:], rest_out[t:]
        if dense is not None:
            dense_prefill_attention(q_rest, k_rest, v_rest, kv_cache, rest, scale, rest_out)
        else:
            paged_attention(q_rest, kv_cache, rest, scale,
                            self.plan(q_rest, kv_cache, rest, sliding_window), rest_out,
                            sliding_window, logit_softcap, kv_scale)
        return out

    def forward_kept(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_cache: torch.Tensor, meta: AttentionMetadata, kept: KeptRows,
                     scale: float, sliding_window: int | None = None,
                     logit_softcap: float | None = None, kv_scale: torch.Tensor | None = None,
                     *, rope: Rope | None = None) -> torch.Tensor:
        """Write every row's k and v (rotated by rope), then attend the rows ``kept`` lists
        as a step of that many decodes: planned as the decode graphs plan such a step, and where
        that plan rotates in the attention's launch, rotated there again (the same bits written
        to the same slots), so that it runs a kernel variant the graphs compiled."""
        index = kept.index
        rotated, _ = self._write_new_kv(q, k, v, kv_cache, meta.slot_mapping, kv_scale, rope)
        if not index.shape[0]:
            return q.new_empty(0, *q.shape[1:])
        plan = self._decodes_plan(q, kv_cache, kept.meta, sliding_window)
        if rope is not None and self.triton_kv_write and rotates_in_launch(plan):
            return paged_attention(q.index_select(0, index), kv_cache, kept.meta, scale, plan,
                                   None, sliding_window, logit_softcap, kv_scale,
                                   rope=Rope(rope.rotary, rope.positions.index_select(0, index)),
                                   k=k.index_select(0, index), v=v.index_select(0, index))
        return paged_attention(rotated.index_select(0, index), kv_cache, kept.meta, scale, plan,
                               None, sliding_window, logit_softcap, kv_scale)

    def _write_new_kv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_scale: torch.Tensor | None, rope: Rope | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k and v ([T, Hkv, D]) into their slots, rotated first by rope with q (in one
        Triton launch with the Triton KV write); returns q and k as rotated."""
        if not self.triton_kv_write:
            return rotate_and_write(q, k, v, kv_cache, slot_mapping, kv_scale, rope)
        if rope is None:
            from hifc.layers.triton_kv_write import triton_write_kv_cache
            triton_write_kv_cache(k, v, kv_cache, slot_mapping, kv_scale)
            return q, k
        from hifc.layers.triton_kv_write import rotary_write_kv_cache
        return rotary_write_kv_cache(rope.positions, q, k, v, rope.rotary.cos_cache,
                                     rope.rotary.sin_cache, kv_cache, slot_mapping, kv_scale)

    def _dense_chunks_after(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            meta: AttentionMetadata) -> tuple[int | None, int | None]:
        """(the step's leading decodes, the first sequence whose chunks attend through the
        fused kernels), or (None, None) where none do: ``dense_chunks_after``, and with
        ``dense_prefill`` None only when ``FusedShapes`` says the fused kernels pay for the
        chunks, or else for the fresh chunks that end the step (``fresh_suffix``; the chunks
        before them stay with the paged kernel). Decided once per step: every layer passes the
        same ``meta``."""
        if self._dense is None or self._dense[0] is not meta:
            decodes = dense_chunks_after(meta, q.dtype, 2 * k[0].numel() * k.element_size())
            start = decodes
            if decodes is not None and self.dense_prefill is None:
                start = self._fused_from(q, k, v, meta, decodes)
            self._dense = (meta, (None, None) if start is None else (decodes, start))
        return self._dense[1]

    def _fused_from(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    meta: AttentionMetadata, first: int) -> int | None:
        """Of the chunks from sequence ``first`` on, where those that pay for their shapes
        start (``_dense_chunks_after``), recording the shapes seen and built."""
        def calls(start: int) -> tuple[list[tuple], int]:
            t = meta.query_start_loc_cpu[start]
            rest = self._apart_metas(meta, start)[1] if start else meta
            return chunk_call_shapes(q[t:], k[t:], v[t:], rest)

        shapes, flops = calls(first)
        suffix = None
        if not self.fused_shapes.pays(shapes, flops):
            suffix = fresh_suffix(meta, first)
        if suffix is None:  # the chunks as a whole
            return first if self.fused_shapes.take(shapes, flops) else None
        fresh, fresh_flops = calls(suffix)
        self.fused_shapes.record([shape for shape in shapes if shape not in fresh], False)
        return suffix if self.fused_shapes.take(fresh, fresh_flops) else None

    def _apart_metas(self, meta: AttentionMetadata,
                     decodes: int) -> tuple[AttentionMetadata, AttentionMetadata]:
        """The metadata of the step's first ``decodes`` sequences (its leading decodes, or
        those before the fresh chunks that attend apart) and of those after them (made once
        per step: every layer passes the same ``meta``). Both keep the step's max_seq_len,
        which fixes a CUDA graph's launch plans."""
        key = (id(meta), decodes)
        if key not in self._apart or self._apart[key][0] is not meta:
            if len(self._apart) >= 4:  # a step needs at most three
                self._apart.clear()
            d, qsl = decodes, meta.query_start_loc_cpu
            t = qsl[d]  # their tokens
            first = AttentionMetadata(
                meta.slot_mapping[:t], meta.query_start_loc[:d + 1], meta.seq_lens[:d],
                meta.block_tables[:d], qsl[:d + 1], meta.seq_lens_cpu[:d],
                max(b - a for a, b in zip(qsl[:d], qsl[1:d + 1])), meta.max_seq_len,
                meta.block_size)
            rest = AttentionMetadata(
                meta.slot_mapping[t:], meta.query_start_loc[d:] - t, meta.seq_lens[d:],
                meta.block_tables[d:], [x - t for x in qsl[d:]], meta.seq_lens_cpu[d:],
                meta.max_query_len, meta.max_seq_len, meta.block_size)
            self._apart[key] = (meta, first, rest)
        return self._apart[key][1], self._apart[key][2]


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    plan: LaunchPlan, out: torch.Tensor | None = None,
                    sliding_window: int | None = None,
                    logit_softcap: float | None = None,
                    kv_scale: torch.Tensor | None = None, *, rope: Rope | None = None,
                    k: torch.Tensor | None = None, v: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q ([T, Hq, D]) over the paged cache ([2, NB, BS, Hkv, D]), within the
    last sliding_window keys of each query if set, scores soft-capped at logit_softcap if set;
    a float8 cache is read with kv_scale ([2, Hkv] float32: K and V scales).

    rope, k, v (a decode-only step, one token per sequence): q and the new keys k ([T, Hkv, D])
    are not rotated yet, and k and v are not in the cache. The launch rotates them and writes k
    and v as ``rotary_write_kv_cache`` does (a negative slot skipped), then attends.

    Prompt chunks planned in whole ``MAX_BLOCK_M``-row q blocks without a split attend through
    :mod:`hifc.layers.triton_prompt_attention` where it takes them (K/V loaded by TMA)."""
    check_kv_scale(kv_cache, kv_scale)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[-2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if kv_cache.shape[-1] != head_dim or kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim], "
                         "contiguous in head_dim, with q's head_dim")
    if meta.block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous along its last dimension")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
    if num_tokens == 0:
        return out
    group = num_q_heads // num_kv_heads
    head_dim_pad = max(16, _next_pow2(head_dim))
    num_seqs = meta.num_seqs
    decode_only = meta.max_query_len == 1 and num_tokens == num_seqs
    if (plan.block_m == MAX_BLOCK_M and plan.num_segments == 1 and not decode_only
            and triton_prompt_attention.takes(q, kv_cache, meta.block_size, sliding_window,
                                              logit_softcap)):
        return triton_prompt_attention.prompt_attention(q, kv_cache, meta, scale, out)
    # an upper bound (spare programs exit), but exactly one per sequence in a decode-only step
    num_q_blocks = num_seqs if decode_only else num_tokens // plan.block_q + num_seqs
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [NB, BS, Hkv, D]
    fp8 = kv_cache.dtype == FP8
    # [Hkv] each; without float8 unused (any tensor will do)
    k_scale, v_scale = (kv_scale[0], kv_scale[1]) if fp8 else (meta.seq_lens, meta.seq_lens)
    split = plan.num_segments > 1
    merge = decode_only and merges_in_launch(plan.num_segments, group)
    pdl = triton_pdl.launch_options(q.device)
    if split:
        segm_out = torch.empty(num_tokens, num_q_heads, plan.num_segments, head_dim_pad,
                               dtype=torch.float32, device=q.device)
        segm_max = torch.empty(num_tokens, num_q_heads, plan.num_segments, dtype=torch.float32,
                               device=q.device)
        segm_sum = torch.empty_like(segm_max)
        segm_count = (out if merge else
                      torch.empty(num_tokens, dtype=torch.int32, device=q.device))
    else:
        segm_out = segm_max = segm_sum = segm_count = out  # unused
    arrivals = _arrivals(q.device, num_tokens * num_kv_heads) if merge else segm_count
    new_kv = _new_kv_operands(rope, q, k, v, kv_cache, meta, decode_only)
    _paged_attention_kernel[(num_q_blocks, num_kv_heads, plan.num_segments)](
        out, segm_out, segm_max, segm_sum, segm_count,
        q, k_cache, v_cache,
        meta.block_tables, meta.seq_lens, meta.query_start_loc, k_scale, v_scale,
        *new_kv[:6], arrivals,
        # soft-capping: tanh(q.k * scale / cap) * cap, in log2 units
        scale * LOG2E if logit_softcap is None else scale / logit_softcap,
        0.0 if logit_softcap is None else logit_softcap * LOG2E,
        sliding_window or 0, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0), *new_kv[6:],
        NUM_Q_HEADS=num_q_heads, GROUP=group,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=meta.block_size, TILE=plan.tile,
        BLOCK_M=plan.block_m, BLOCK_Q=plan.block_q,
        NUM_SEGMENTS=plan.num_segments, SEGMENT_TILES=plan.segment_tiles,
        DECODE_ONLY=decode_only,
        SLIDING=sliding_window is not None,
        SOFTCAP=logit_softcap is not None, KV_FP8=fp8,
        DOT_PRECISION="tf32x3" if q.dtype == torch.float32 else "tf32",
        **pdl, ROPE=rope is not None, MERGE=merge, GROUP_PAD=_next_pow2(group),
        SEGMENTS_PAD=max(2, _next_pow2(plan.num_segments)), FP8_MAX=FP8_E4M3_MAX,
        FP8_ASM=fp8 and q.dtype != torch.float32 and q.is_cuda and not interpreting(),
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if split and not merge:
        _merge_segments_kernel[(num_tokens, num_q_heads)](
            out, segm_out, segm_max, segm_sum, segm_count,
            out.stride(0), out.stride(1),
            NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            NUM_SEGMENTS=plan.num_segments, SEGMENTS_PAD=max(2, _next_pow2(plan.num_segments)),
            PRELOAD=plan.segment_tiles == 1, **pdl, num_warps=4,
        )
    return out
