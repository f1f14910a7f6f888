"""Paged attention: the per-step metadata, the KV-cache write, and the torch reference path.

KV cache of one layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (index 0 = K,
1 = V). A token's slot is ``block_id * block_size + offset``. Every step writes the K/V of its
new tokens into their slots first, then each query attends causally over its sequence's whole
context through the block table, so prefill, recompute-prefill and decode are one operation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


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

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Scatter new keys/values ([T, Hkv, D]) into their cache slots."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ([seq_len, Hkv, D]) of one sequence, gathered through its block table."""
    num_blocks = -(-seq_len // block_size)
    blocks = block_table[:num_blocks].long()
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    k = kv_cache[0][blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
    v = kv_cache[1][blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
    return k, v


def reference_paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                              scale: float) -> torch.Tensor:
    """Causal attention of q ([T, Hq, D]) over each sequence's cached context. Returns [T, Hq, D]."""
    out = torch.empty_like(q)
    num_q_heads = q.shape[1]
    num_kv_heads = kv_cache.shape[-2]
    group = num_q_heads // num_kv_heads
    qsl = meta.query_start_loc_cpu
    for i, seq_len in enumerate(meta.seq_lens_cpu):
        start, end = qsl[i], qsl[i + 1]
        num_q = end - start
        k, v = gather_context(kv_cache, meta.block_tables[i], seq_len, meta.block_size)
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = torch.arange(seq_len - num_q, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        mask = k_pos[None, :] <= q_pos[:, None]  # [num_q, S]
        qi = q[start:end].transpose(0, 1)  # [Hq, num_q, D]
        o = F.scaled_dot_product_attention(qi.float(), k.float(), v.float(), attn_mask=mask,
                                           scale=scale)
        out[start:end] = o.transpose(0, 1).to(q.dtype)
    return out


class AttentionBackend(Protocol):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Write k, v ([T, Hkv, D]) into kv_cache, then return attention of q ([T, Hq, D])."""
        ...


class TorchAttentionBackend:
    """Runs anywhere; the reference the Triton kernels are checked against."""

    def forward(self, q, k, v, kv_cache, meta, scale):
        write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        return reference_paged_attention(q, kv_cache, meta, scale)


class AttentionContext:
    """What a model's attention layers see of the paged cache: call ``ctx(layer, q, k, v)``."""

    def __init__(self, meta: AttentionMetadata, kv_caches: list[torch.Tensor],
                 backend: AttentionBackend, scale: float):
        self.meta = meta
        self.kv_caches = kv_caches
        self.backend = backend
        self.scale = scale

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        return self.backend.forward(q, k, v, self.kv_caches[layer_idx], self.meta, self.scale)
