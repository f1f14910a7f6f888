"""Prompt chunks over the paged cache with K/V loaded by the tensor memory accelerator (TMA), for
the Triton backend on Hopper GPUs and later.

The paged kernel (:mod:`hifc.layers.triton_attention`) gathers each KV tile with pointer
loads, one address per element. Here a 64-key tile is one rectangle of the layer's cache seen
as a 2-D tensor [blocks x block size, KV heads x head_dim] (64 rows at the tile's first slot,
the KV head's head_dim columns), which the copy engine loads into shared memory through a
tensor descriptor while the tensor cores work on the tile before (Triton pipelines the loads).
The rest follows the paged kernel: a program owns one q block (BLOCK_Q new tokens of one
sequence) and one KV head, the GROUP query heads of that KV head packed into its rows, found
by binary search over ``query_start_loc`` (``locate_q_block``); the softmax is online, in fp32
and base 2 (``fold_tile``; both serve the paged kernel too); tiles every row sees whole skip
the causal mask. Slots past a sequence's end inside its last block
hold whatever was there: their scores are masked and their values zeroed before the product.

On an H100 (8B attention shapes, bf16, 64-token blocks; docs/RESULTS.md) this took 0.76-0.79 of
the paged kernel's time for steps of 1,024-token chunks and 0.73-0.74 for chunks over 8-16k
cached keys, with 128-row q blocks, four warps and two stages.

Takes (``takes``): a CUDA device of compute capability 9.0 or more, q and a cache of the same
16-bit dtype, the cache contiguous per layer, blocks of a multiple of 64 tokens, head_dim a
power of two from 16 to 128, no sliding window and no soft-capping. The backend sends other
chunks, and decodes, to the paged kernel.
"""
from __future__ import annotations

import functools

import torch

from hifc.layers.attention import AttentionMetadata
from hifc.layers.triton_jit import interpreting, tl, triton
from hifc.layers.triton_jit import jit as _jit

if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor
else:  # CPU-only install: nothing here runs
    TensorDescriptor = None

TILE = 64  # keys per KV tile: one TMA rectangle
BLOCK_M = 128  # rows of a program's q block: BLOCK_M // GROUP tokens x GROUP heads
NUM_WARPS = 4  # one warpgroup: 8 chunks of 1,024 tokens in 251 us against 308 with 8 (H100)
NUM_STAGES = 2
LOG2E = 1.4426950408889634


def takes(q: torch.Tensor, kv_cache: torch.Tensor, block_size: int,
          sliding_window: int | None, logit_softcap: float | None) -> bool:
    """Whether prompt chunks of q ([T, Hq, D]) over kv_cache ([2, NB, BS, Hkv, D]) attend
    here: on a CUDA device with TMA, where ``fits`` says the shapes and options do."""
    return (q.is_cuda and _has_tma(q.device)
            and fits(q, kv_cache, block_size, sliding_window, logit_softcap))


def fits(q: torch.Tensor, kv_cache: torch.Tensor, block_size: int,
         sliding_window: int | None, logit_softcap: float | None) -> bool:
    """Whether the kernel takes these shapes and options (module docstring), on any device."""
    head_dim = q.shape[-1]
    return (sliding_window is None and logit_softcap is None
            and q.dtype in (torch.float16, torch.bfloat16) and kv_cache.dtype == q.dtype
            and block_size % TILE == 0 and 16 <= head_dim <= 128
            and head_dim & (head_dim - 1) == 0 and kv_cache[0].is_contiguous()
            and q.shape[1] // kv_cache.shape[-2] <= BLOCK_M)


@functools.lru_cache(maxsize=None)
def _has_tma(device: torch.device) -> bool:
    return (triton is not None and not interpreting()
            and torch.cuda.get_device_capability(device)[0] >= 9)


@_jit
def locate_q_block(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """(sequence, its first token in the step, its new tokens, the q block's index among the
    sequence's) of q block ``q_block``, in this kernel's grid and the paged one's: sequence i's
    q blocks start at query_start_loc[i] // BLOCK_Q + i, so the sequence is found by binary
    search. A q block past its sequence's tokens has nothing to do."""
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            left = mid + 1
        else:
            right = mid
    seq = left - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    return seq, q_start, q_len, q_block - (q_start // BLOCK_Q + seq)


@_jit
def fold_tile(s, v, m_i, l_i, acc, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one KV tile's scores s ([M, TILE], log2 units; -inf where MASKED hides a key) and
    values v ([TILE, D]) into the online softmax: the running max m_i and sum l_i ([M]) and
    the accumulator acc ([M, D]); this kernel's and the paged one's."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if MASKED:
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row may see nothing yet
    else:
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@_jit
def _attend_tile(q, m_i, l_i, acc, tile, block_row, k_desc, v_desc, kv_col, kv_end, last_key,
                 qk_scale, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, MASKED: tl.constexpr):
    """Fold KV tile ``tile`` into the online softmax; MASKED: the causal diagonal's tiles
    and the sequence's last (keys past kv_end or a row's own position masked)."""
    first = tile * TILE
    slot = tl.load(block_row + first // BLOCK_SIZE) * BLOCK_SIZE + first % BLOCK_SIZE
    k = k_desc.load([slot, kv_col])  # [TILE, D]
    v = v_desc.load([slot, kv_col])
    s = tl.dot(q, k.T) * qk_scale  # [M, TILE] fp32, log2 units
    if MASKED:
        key_pos = first + tl.arange(0, TILE)
        key_valid = key_pos < kv_end
        s = tl.where((key_pos[None, :] <= last_key[:, None]) & key_valid[None, :], s,
                     float("-inf"))
        v = tl.where(key_valid[:, None], v, 0.0)  # slots past the sequence: any bits
    return fold_tile(s, v, m_i, l_i, acc, MASKED, "tf32")


# Not specialised on the batch or the block tables' width (a variant each would compile
# mid-run), as the paged kernel.
@_jit(do_not_specialize=["num_seqs", "stride_bt"],
      do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"])
def _prompt_attention_kernel(out_ptr, q_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr,
                             query_start_loc_ptr, qk_scale, num_seqs, stride_q_t, stride_q_h,
                             stride_o_t, stride_o_h, stride_bt,
                             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                             BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr):
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)  # later q blocks see more keys: first
    kv_head = tl.program_id(1)
    seq, q_start, q_len, q_block_local = locate_q_block(query_start_loc_ptr, q_block, num_seqs,
                                                        BLOCK_Q)
    if q_block_local * BLOCK_Q >= q_len:
        return
    context_len = tl.load(seq_lens_ptr + seq) - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    first_q_pos = q_block_local * BLOCK_Q
    q_pos = first_q_pos + offs_m // GROUP  # [M] index among the sequence's new tokens
    head = kv_head * GROUP + offs_m % GROUP  # [M] query head
    row_valid = (offs_m < BLOCK_Q * GROUP) & (q_pos < q_len)
    token = (q_start + q_pos).to(tl.int64)
    last_key = context_len + q_pos  # [M] the last key each row sees
    kv_end = context_len + tl.minimum(first_q_pos + BLOCK_Q, q_len)
    num_tiles = tl.cdiv(kv_end, TILE)
    full_hi = (context_len + first_q_pos + 1) // TILE  # tiles before it: every row sees whole
    block_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_col = kv_head * HEAD_DIM

    q = tl.load(q_ptr + token[:, None] * stride_q_t + head[:, None] * stride_q_h
                + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for tile in range(0, full_hi):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, tile, block_row, k_desc, v_desc, kv_col,
                                     kv_end, last_key, qk_scale, BLOCK_SIZE, TILE, False)
    for tile in range(full_hi, num_tiles):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, tile, block_row, k_desc, v_desc, kv_col,
                                     kv_end, last_key, qk_scale, BLOCK_SIZE, TILE, True)
    out = acc / tl.where(row_valid, l_i, 1.0)[:, None]
    tl.store(out_ptr + token[:, None] * stride_o_t + head[:, None] * stride_o_h
             + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def prompt_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float, out: torch.Tensor) -> torch.Tensor:
    """Causal attention of q ([T, Hq, D], its K/V already in the cache) over the paged cache
    ([2, NB, BS, Hkv, D]) into out ([T, Hq, D]); the caller checked ``takes``."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    group = q.shape[1] // num_kv_heads
    block_q = BLOCK_M // group
    rows = num_blocks * block_size
    k_desc, v_desc = (TensorDescriptor.from_tensor(
        part.view(rows, num_kv_heads * head_dim), [TILE, head_dim]) for part in kv_cache)
    grid = (q.shape[0] // block_q + meta.num_seqs, num_kv_heads)  # spare programs exit
    _prompt_attention_kernel[grid](
        out, q, k_desc, v_desc, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        scale * LOG2E, meta.num_seqs, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        meta.block_tables.stride(0), GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE=TILE, BLOCK_M=BLOCK_M, BLOCK_Q=block_q, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES)
    return out
