"""Paged attention: the per-step metadata, the KV-cache write, and the torch reference path.

KV cache of one layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (index 0 = K,
1 = V). A token's slot is ``block_id * block_size + offset``. Every step writes the K/V of its
new tokens into their slots first, then each query attends causally over its sequence's context
through the block table, so prefill, recompute-prefill and decode are one operation.

The torch reference (``reference_paged_attention``, the CPU's path) attends the rows of one
new token (decodes) in batched groups of similar context length, their contexts gathered slot by
slot into a reused workspace, and each prompt chunk on its own (on the CPU, a long chunk after
cached context in two parts: the context, and the chunk's own keys under torch's causal flag).
It computes in float32, except a bfloat16 model's attention on the CPU (``_in_bfloat16``).

Each layer attends in its own way (``LayerAttention``: scale, sliding window, logit soft-capping),
fixed when the model is built; ``AttentionContext`` looks it up by layer index.

An FP8 cache (``torch.float8_e4m3fn``) comes with the layer's scales ``kv_scale`` ([2, Hkv]
float32: K and V, per KV head): a new key is written as ``k / k_scale`` clamped to +-448 and
rounded to float8, and read back as ``float(fp8) * k_scale`` (the same for values).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol, Sequence

import torch
import torch.nn.functional as F

from hifc.dtypes import FP8_E4M3_MAX

if TYPE_CHECKING:
    from hifc.layers.rotary import RotaryEmbedding

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class LayerAttention:
    """How one layer attends (constants of the model, the same at every step)."""

    scale: float  # multiplies q.k
    # A query at position p sees keys p - sliding_window + 1 .. p; None: the whole context.
    sliding_window: int | None = None
    # Scores become logit_softcap * tanh(scores / logit_softcap) before the softmax (Gemma 2).
    logit_softcap: float | None = None

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            raise ValueError(f"logit_softcap must be positive, got {self.logit_softcap}")


@dataclass
class AttentionMetadata:
    """Inputs shared by every layer in one step. T = new tokens in the step, B = sequences."""

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    query_start_loc: torch.Tensor  # [B+1] int32: offsets of each sequence's new tokens in the batch
    seq_lens: torch.Tensor  # [B] int32: context length of each sequence including new tokens
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    max_query_len: int
    max_seq_len: int
    block_size: int
    # the first this many sequences are decodes (one new token each) that a backend may attend
    # in a launch of their own, apart from the prompt chunks after them (0: no such split)
    num_leading_decodes: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


class KeptRows(NamedTuple):
    """The rows of a step that its last layer attends (those whose outputs the step needs; the
    K/V of every row is written): their indices among the step's tokens, and metadata that
    attends each of them as a query of its own, in a decode's shape (one new token over its
    position + 1 keys)."""
    index: torch.Tensor  # [N] int64, on the step's device
    meta: AttentionMetadata  # N single-token rows


def kept_rows(meta: AttentionMetadata, rows: Sequence[int],
              tensor: Callable[[list[int], torch.dtype], torch.Tensor] | None = None
              ) -> KeptRows:
    """The ``KeptRows`` of a step's ``rows`` (indices among its tokens, each at most once);
    ``tensor`` makes a device tensor of host values (default: a plain copy)."""
    device = meta.block_tables.device
    if tensor is None:
        def tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)
    qsl, rows = meta.query_start_loc_cpu, list(rows)
    seqs, lens = [], []
    for row in rows:
        if not 0 <= row < qsl[-1]:
            raise IndexError(f"row {row} is not one of the step's {qsl[-1]} tokens")
        i = bisect.bisect_right(qsl, row) - 1
        seqs.append(i)
        lens.append(meta.seq_lens_cpu[i] - (qsl[i + 1] - 1 - row))  # its position + 1
    index = tensor(rows, torch.long)
    n = len(rows)
    packed = tensor(seqs + lens + list(range(n + 1)), torch.int32)  # one copy
    kept = AttentionMetadata(
        slot_mapping=meta.slot_mapping.index_select(0, index),
        query_start_loc=packed[2 * n:], seq_lens=packed[n:2 * n],
        block_tables=meta.block_tables.index_select(0, packed[:n]),
        query_start_loc_cpu=list(range(n + 1)), seq_lens_cpu=lens, max_query_len=1,
        max_seq_len=max(lens, default=0), block_size=meta.block_size, num_leading_decodes=n)
    return KeptRows(index, kept)


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Keys or values x ([T, Hkv, D]) as float8: x / scale ([Hkv]) clamped to e4m3's range."""
    scaled = x.float() / scale[:, None]
    return scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Float8 keys or values x ([S, Hkv, D]) read back in float32: x * scale ([Hkv]), into out
    (float32, x's shape) if given."""
    if out is None:
        return x.float() * scale[:, None]
    return out.copy_(x).mul_(scale[:, None])


def check_kv_scale(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None) -> None:
    """ValueError unless an FP8 cache comes with its scales ([2, Hkv] float32) and any other
    cache without."""
    if kv_cache.dtype != FP8:
        if kv_scale is not None:
            raise ValueError(f"kv_scale is only for float8 caches, not {kv_cache.dtype}")
        return
    if (kv_scale is None or kv_scale.dtype != torch.float32
            or tuple(kv_scale.shape) != (2, kv_cache.shape[-2])):
        raise ValueError("a float8 KV cache needs kv_scale: [2, num_kv_heads] float32 (K and V "
                         "scales)")


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None) -> None:
    """Scatter new keys/values ([T, Hkv, D]) into their cache slots (quantised with kv_scale
    ([2, Hkv]) in a float8 cache)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if kv_cache.dtype == FP8:  # torch has no float8 index_copy_ on the CPU: copy the bytes
        k = quantize_kv(k, kv_scale[0]).view(torch.uint8)
        v = quantize_kv(v, kv_scale[1]).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
                   block_size: int, kv_scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ([seq_len, Hkv, D]) of one sequence, gathered through its block table (in
    float32, dequantised with kv_scale, from a float8 cache)."""
    num_blocks = -(-seq_len // block_size)
    blocks = block_table[:num_blocks].long()
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    k = kv_cache[0][blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
    v = kv_cache[1][blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
    if kv_cache.dtype == FP8:
        return dequantize_kv(k, kv_scale[0]), dequantize_kv(v, kv_scale[1])
    return k, v


# A group of rows of one new token gathers at most this many floats of K (and as many of V), so
# that a batch of long contexts is attended in several groups through a workspace of this size.
SINGLE_QUERY_GROUP_FLOATS = 1 << 22
# A row joins a group (of longer contexts) when the padding it brings is at most this many
# positions or a quarter of the group's span. One group's call costs about as much as gathering
# and attending ~500 positions on a 2-core CPU: fewer groups of more padding would cost more.
SINGLE_QUERY_PAD = 512


class SingleQueryGroup(NamedTuple):
    """Rows of one new token each (decodes, one-token chunks), attended in one batched call:
    their contexts are gathered slot by slot, padded to the group's longest."""
    tokens: torch.Tensor  # [n] int64: each row's token index in q
    slots: torch.Tensor  # [n * S] int64: cache slot of each context position; past a row's
    # end, its first slot again (real data that the mask hides)
    positions: torch.Tensor  # [1, S] int64: 0 .. S-1
    last: torch.Tensor  # [n, 1] int64: each row's query position (its context length - 1)


class StepRows(NamedTuple):
    """How the torch reference attends one step's rows, the same in every layer."""
    multi: list[int]  # rows of more than one new token, attended one at a time
    groups: list[SingleQueryGroup]  # rows of one new token, longest contexts first
    # float32 [2, floats]: the K and V that a group gathers, reused by every group and step
    workspace: torch.Tensor


def step_rows(meta: AttentionMetadata, row_floats: int,
              workspace: torch.Tensor | None = None) -> StepRows:
    """A step's rows, its rows of one new token grouped by context length (``row_floats``:
    num_kv_heads * head_dim floats per context position); workspace: one to reuse, replaced if
    a group needs more or if it holds more than the group budget that this step does not use."""
    qsl, seq_lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
    multi, single = [], []
    for i in range(len(seq_lens)):
        (single if qsl[i + 1] - qsl[i] == 1 else multi).append(i)
    single.sort(key=seq_lens.__getitem__, reverse=True)
    budget = max(SINGLE_QUERY_GROUP_FLOATS // row_floats, 1)
    groups, start, most = [], 0, 0
    while start < len(single):
        span = seq_lens[single[start]]
        end, slack = start + 1, max(SINGLE_QUERY_PAD, span // 4)
        while (end < len(single) and (end - start + 1) * span <= budget
               and span - seq_lens[single[end]] <= slack):
            end += 1
        groups.append(_single_query_group(meta, single[start:end], span))
        most = max(most, (end - start) * span * row_floats)
        start = end
    # past the group budget (one row of a long context), whole multiples of it: a decode that
    # grows by a position per step reallocates once per multiple, and a later step of shorter
    # rows drops the excess
    size = most if most <= SINGLE_QUERY_GROUP_FLOATS else (
        -(-most // SINGLE_QUERY_GROUP_FLOATS) * SINGLE_QUERY_GROUP_FLOATS)
    if (workspace is None or workspace.shape[1] < most
            or workspace.shape[1] > max(size, SINGLE_QUERY_GROUP_FLOATS)):
        workspace = torch.empty(2, size, dtype=torch.float32, device=meta.block_tables.device)
    return StepRows(multi, groups, workspace)


def _single_query_group(meta: AttentionMetadata, rows: list[int], span: int
                        ) -> SingleQueryGroup:
    device = meta.block_tables.device
    lens = torch.tensor([meta.seq_lens_cpu[i] for i in rows], device=device)[:, None]
    positions = torch.arange(span, device=device)[None, :]
    index = torch.tensor(rows, device=device)
    tables = meta.block_tables[index, :-(-span // meta.block_size)].long()
    slots = (tables.gather(1, (positions // meta.block_size).expand(len(rows), span))
             * meta.block_size + positions % meta.block_size)
    slots = torch.where(positions < lens, slots, slots[:, :1])
    tokens = torch.tensor([meta.query_start_loc_cpu[i] for i in rows], device=device)
    return SingleQueryGroup(tokens, slots.reshape(-1), positions, lens - 1)


def _gather_into(out: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
                 scale: torch.Tensor | None) -> None:
    """Keys or values of one layer's K or V cache ([num_blocks, block_size, Hkv, D]) at slots,
    into out ([len(slots), Hkv, D]: float32, or the cache's own type; a float8 cache
    dequantised with scale ([Hkv]))."""
    flat = cache.view(-1, *cache.shape[-2:])
    if cache.dtype == out.dtype:
        torch.index_select(flat, 0, slots, out=out)
    elif cache.dtype == FP8:  # torch has no float8 index_select on the CPU: gather the bytes
        dequantize_kv(flat.view(torch.uint8).index_select(0, slots).view(FP8), scale, out)
    else:
        out.copy_(flat.index_select(0, slots))


def _in_bfloat16(q: torch.Tensor, kv_cache: torch.Tensor, logit_softcap: float | None) -> bool:
    """Whether a bfloat16 model attends in bfloat16 (else float32): on the CPU, without
    soft-capping. torch's CPU flash kernel accumulates in float32 and takes bfloat16 inputs
    2.6-2.9x faster than float32 ones (SmolLM2's heads, a 512- and a 2,048-token prompt)."""
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16
            and kv_cache.dtype == torch.bfloat16 and logit_softcap is None)


def _softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          visible: torch.Tensor, scale: float, cap: float) -> torch.Tensor:
    """Attention whose scores become cap * tanh(scores / cap) before the softmax (Gemma 2),
    which torch's scaled_dot_product_attention does not do: q [..., L, D] against k, v
    [..., S, D], visible broadcasting to [..., L, S]."""
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1) @ v


def _attend_single_queries(q: torch.Tensor, kv_cache: torch.Tensor, group: SingleQueryGroup,
                           workspace: torch.Tensor, out: torch.Tensor, scale: float,
                           sliding_window: int | None, logit_softcap: float | None,
                           kv_scale: torch.Tensor | None) -> None:
    """Attention of a group's rows in one call, written into out. A KV head's query heads are
    its queries' rows: [n, Hkv, group, D] against [n, Hkv, S, D], no repeated K/V."""
    n, span = group.last.shape[0], group.positions.shape[1]
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = kv_cache.shape[-2]
    shape = (n, span, num_kv_heads, head_dim)
    if _in_bfloat16(q, kv_cache, logit_softcap):  # the float32 workspace holds twice as many
        workspace = workspace.view(torch.bfloat16)
    k, v = workspace[:, :n * span * num_kv_heads * head_dim].view(2, *shape)
    for i, gathered in enumerate((k, v)):
        _gather_into(gathered.view(-1, num_kv_heads, head_dim), kv_cache[i], group.slots,
                     None if kv_scale is None else kv_scale[i])
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [n, Hkv, S, D]
    qg = q[group.tokens].to(k.dtype).view(n, num_kv_heads, num_q_heads // num_kv_heads,
                                          head_dim)
    visible = group.positions <= group.last  # [n, S]
    if sliding_window is not None:
        visible &= group.positions > group.last - sliding_window
    visible = visible[:, None, None, :]
    if logit_softcap is None:
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=visible, scale=scale)
    else:
        o = _softcapped_attention(qg, k, v, visible, scale, logit_softcap)
    out[group.tokens] = o.reshape(n, num_q_heads, head_dim).to(q.dtype)


# A chunk after cached context on the CPU is attended in two parts (``_attend_after_context``)
# when its queries and keys make at least this many pairs: below it, one masked call is about as
# fast or faster (SmolLM2's heads, 2 threads: the two parts at 0.6-1.1x of its speed from 1k to
# 65k pairs, 1.1-2.0x from 132k; docs/results/2026-12-05-cpu-chunks/split_probe.txt).
SPLIT_CONTEXT_PAIRS = 1 << 16


def attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ([1, Hq, n, D]) and each row's log-sum-exp of its scaled scores ([1, Hq, n]
    float32), through cuDNN on CUDA and torch's CPU flash kernel on the CPU; k and v may have
    fewer heads (grouped-query)."""
    if q.is_cuda:
        o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    else:
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale)
    return o, lse


def _attend_after_context(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached: int,
                          scale: float) -> torch.Tensor:
    """Causal attention of a chunk's queries q ([1, Hq, C, D]) whose keys k, v ([1, Hkv,
    cached + C, D]) start with ``cached`` positions of context, on the CPU: the context unmasked
    and the chunk's own keys with torch's causal flag (which skips the blocks above the
    diagonal, where a mask is applied to every block), merged by their log-sum-exps."""
    o_context, lse_context = attend_with_lse(q, k[:, :, :cached], v[:, :, :cached], scale,
                                             causal=False)
    o_chunk, lse_chunk = attend_with_lse(q, k[:, :, cached:], v[:, :, cached:], scale,
                                         causal=True)
    weight = torch.sigmoid(lse_context - lse_chunk)[..., None]  # the context's share
    o_chunk = o_chunk.float()
    return o_chunk.add_(o_context.float().sub_(o_chunk).mul_(weight))


def _attend_sequence(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, i: int,
                     out: torch.Tensor, scale: float, sliding_window: int | None,
                     logit_softcap: float | None, kv_scale: torch.Tensor | None) -> None:
    """Attention of sequence i's new tokens over its context, written into out. Inputs are 4-D
    ([1, heads, tokens, D]): with fewer dimensions torch takes its slower math path."""
    start, end = meta.query_start_loc_cpu[i], meta.query_start_loc_cpu[i + 1]
    seq_len = meta.seq_lens_cpu[i]
    k, v = gather_context(kv_cache, meta.block_tables[i], seq_len, meta.block_size, kv_scale)
    plain = logit_softcap is None and sliding_window is None
    compute = torch.bfloat16 if _in_bfloat16(q, kv_cache, logit_softcap) else torch.float32
    k = k.transpose(0, 1).to(compute)[None]  # [1, Hkv, S, D]
    v = v.transpose(0, 1).to(compute)[None]
    qi = q[start:end].transpose(0, 1).to(compute)[None]  # [1, Hq, num_q, D]
    num_q, cached = end - start, seq_len - (end - start)
    if plain and not cached:
        # a whole prompt: torch's causal flag skips the blocks above the diagonal (1.5-2.2x
        # faster on the CPU at 1-4k tokens), where a mask is applied to every block
        o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale,
                                           enable_gqa=True)
    elif plain and q.device.type == "cpu" and num_q * seq_len >= SPLIT_CONTEXT_PAIRS:
        o = _attend_after_context(qi, k, v, cached, scale)
    else:
        q_pos = torch.arange(cached, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # [num_q, S]
        if sliding_window is not None:
            visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
        if logit_softcap is None:
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=visible, scale=scale,
                                               enable_gqa=True)
        else:
            group = q.shape[1] // kv_cache.shape[-2]
            o = _softcapped_attention(qi, k.repeat_interleave(group, dim=1),
                                      v.repeat_interleave(group, dim=1), visible, scale,
                                      logit_softcap)
    out[start:end] = o[0].transpose(0, 1).to(q.dtype)  # [num_q, Hq, D]


def reference_paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                              scale: float, sliding_window: int | None = None,
                              logit_softcap: float | None = None,
                              kv_scale: torch.Tensor | None = None,
                              rows: StepRows | None = None) -> torch.Tensor:
    """Causal attention of q ([T, Hq, D]) over each sequence's cached context, in float32 (a
    bfloat16 q and cache on the CPU without soft-capping: in bfloat16, accumulated in float32
    by torch's kernel, as the Triton kernels do), as ``LayerAttention`` describes it (window,
    soft-capping); a float8 cache is read with kv_scale ([2, Hkv]). Rows of one new token are
    attended in batched groups, the others one at a time; rows: the step's ``step_rows``, if
    the caller keeps them for its layers.
    Returns [T, Hq, D]."""
    check_kv_scale(kv_cache, kv_scale)
    out = torch.empty_like(q)
    if rows is None:
        rows = step_rows(meta, kv_cache.shape[-2] * kv_cache.shape[-1])
    for group in rows.groups:
        _attend_single_queries(q, kv_cache, group, rows.workspace, out, scale, sliding_window,
                               logit_softcap, kv_scale)
    for i in rows.multi:
        _attend_sequence(q, kv_cache, meta, i, out, scale, sliding_window, logit_softcap,
                         kv_scale)
    return out


def rotate_and_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None,
                     rope: Rope | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by rope (if given) in torch, then write k and v into their slots; returns
    q and k as rotated."""
    if rope is not None:
        q, k = rope.rotary(rope.positions, q, k)
    check_kv_scale(kv_cache, kv_scale)
    write_kv_cache(k, v, kv_cache, slot_mapping, kv_scale)
    return q, k


class Rope(NamedTuple):
    """RoPE still to apply to q and k: ``rotary(positions, q, k)``. A backend applies it before
    it writes the cache, in the same launch where it can."""
    rotary: RotaryEmbedding
    positions: torch.Tensor  # [T]


class AttentionBackend(Protocol):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                logit_softcap: float | None = None, kv_scale: torch.Tensor | None = None, *,
                rope: Rope | None = None) -> torch.Tensor:
        """Write k, v ([T, Hkv, D]) into kv_cache, then return attention of q ([T, Hq, D]).
        kv_scale: the K and V scales ([2, Hkv] float32) of a float8 cache, else None. rope: q
        and k are not rotated yet; the backend rotates them first."""
        ...

    def forward_kept(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_cache: torch.Tensor, meta: AttentionMetadata, kept: KeptRows,
                     scale: float, sliding_window: int | None = None,
                     logit_softcap: float | None = None, kv_scale: torch.Tensor | None = None,
                     *, rope: Rope | None = None) -> torch.Tensor:
        """As ``forward``, every row's k and v written, but only the attention of the rows
        ``kept`` lists returned ([N, Hq, D]), computed for those rows alone."""
        ...

    def graph_context_caps(self, max_model_len: int) -> list[int]:
        """The longest contexts a padded step of decodes beside a prompt chunk is planned for,
        ascending, the last max_model_len: a step runs planned for the smallest that holds its
        sequences."""
        ...

    def plan_decodes_as_graphs(self, batch_sizes: list[int], max_model_len: int,
                               num_q_heads: int, kv_cache: torch.Tensor,
                               dtype: torch.dtype) -> dict[int, list[int]]:
        """The padded decode steps' batch sizes and max_model_len, and the model's attention
        shapes (query heads, one layer's cache, q's dtype) -> each batch size's context caps,
        as ``graph_context_caps``'s. A backend may plan other steps' decodes as those steps
        are planned (to run the kernels compiled for them)."""
        ...

    def warm_up_shapes(self) -> list[tuple[int, int]]:
        """(cached context, new tokens) of the prompt chunks the runner's start-up warm-up runs
        one step each of (those that fit the model), so that the kernel variants the backend's
        first prompt chunks take compile then."""
        ...

    def warm_up(self, num_q_heads: int, kv_cache: torch.Tensor,
                layers: Sequence[LayerAttention]) -> None:
        """At start-up, after the runner's warm-up steps: compile the kernels that only some
        later steps reach (``num_q_heads``: the query heads of a layer on this device;
        ``kv_cache``: one layer's cache; ``layers``: the model's ``attention_layers``)."""
        ...


class TorchAttentionBackend:
    """Runs anywhere; the reference the Triton kernels are checked against. It makes a step's
    ``step_rows`` at its first layer, for all of them, and keeps the gather workspace from step
    to step."""

    def __init__(self) -> None:
        # the step whose metadata the rows were made from, its row_floats and step_rows
        self._rows: tuple[AttentionMetadata, int, StepRows] | None = None

    def graph_context_caps(self, max_model_len: int) -> list[int]:
        return [max_model_len]  # it plans nothing

    def plan_decodes_as_graphs(self, batch_sizes, max_model_len, num_q_heads, kv_cache, dtype):
        return {batch: [max_model_len] for batch in batch_sizes}  # it plans nothing

    def warm_up_shapes(self) -> list[tuple[int, int]]:
        return []  # it compiles nothing

    def warm_up(self, num_q_heads: int, kv_cache: torch.Tensor,
                layers: Sequence[LayerAttention]) -> None:
        pass  # it compiles nothing

    def forward(self, q, k, v, kv_cache, meta, scale, sliding_window=None, logit_softcap=None,
                kv_scale=None, *, rope=None):
        q, _ = rotate_and_write(q, k, v, kv_cache, meta.slot_mapping, kv_scale, rope)
        return reference_paged_attention(q, kv_cache, meta, scale, sliding_window, logit_softcap,
                                         kv_scale, self._step_rows(meta, kv_cache))

    def forward_kept(self, q, k, v, kv_cache, meta, kept, scale, sliding_window=None,
                     logit_softcap=None, kv_scale=None, *, rope=None):
        q, _ = rotate_and_write(q, k, v, kv_cache, meta.slot_mapping, kv_scale, rope)
        return reference_paged_attention(q.index_select(0, kept.index), kv_cache, kept.meta,
                                         scale, sliding_window, logit_softcap, kv_scale,
                                         self._step_rows(kept.meta, kv_cache))

    def _step_rows(self, meta: AttentionMetadata, kv_cache: torch.Tensor) -> StepRows:
        """``step_rows`` of meta, made at its first layer and kept for the others, in the
        workspace of the metadata before."""
        row_floats = kv_cache.shape[-2] * kv_cache.shape[-1]
        if self._rows is None or self._rows[0] is not meta or self._rows[1] != row_floats:
            workspace = None if self._rows is None else self._rows[2].workspace
            self._rows = meta, row_floats, step_rows(meta, row_floats, workspace)
        return self._rows[2]


class AttentionContext:
    """What a model's attention layers see of the paged cache: call ``ctx(layer, q, k, v)``.

    layers: each layer's ``LayerAttention`` (the model's ``attention_layers``); kv_scales: each
    layer's K and V scales ([2, Hkv] float32) of float8 caches, else None; kept: the
    ``KeptRows`` of the rows the model keeps in its last layer (their index is the ``keep`` it
    passes), which that layer then attends alone."""

    def __init__(self, meta: AttentionMetadata, kv_caches: list[torch.Tensor],
                 backend: AttentionBackend, layers: Sequence[LayerAttention],
                 kv_scales: Sequence[torch.Tensor] | None = None, kept: KeptRows | None = None):
        self.meta = meta
        self.kv_caches = kv_caches
        self.backend = backend
        self.layers = layers
        self.kv_scales = kv_scales
        self.kept = kept

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: Rope | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of layer_idx's q over the cache with k, v written into it (rotated first by
        rope, if given, with q) -> [T, Hq, D]; with ``keep`` (indices of rows, int64 on the
        device), of those rows -> [N, Hq, D], every row's k and v still written: attended alone
        where keep is ``kept``'s index, else among every row (a CUDA graph's rows)."""
        layer = self.layers[layer_idx]
        kv_scale = self.kv_scales[layer_idx] if self.kv_scales is not None else None
        options = dict(sliding_window=layer.sliding_window, logit_softcap=layer.logit_softcap,
                       kv_scale=kv_scale, rope=rope)
        if keep is not None and self.kept is not None and keep is self.kept.index:
            return self.backend.forward_kept(q, k, v, self.kv_caches[layer_idx], self.meta,
                                             self.kept, layer.scale, **options)
        out = self.backend.forward(q, k, v, self.kv_caches[layer_idx], self.meta, layer.scale,
                                   **options)
        return out if keep is None else out.index_select(0, keep)
