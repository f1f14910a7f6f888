"""Builds each input tensor of a step from the scheduler's work list, one function each."""
from __future__ import annotations

import torch

from hifc.core.scheduler import ScheduledSeq
from hifc.layers.attention import AttentionMetadata


def build_input_ids(work: list[ScheduledSeq], device) -> torch.Tensor:
    ids = [t for w in work for t in w.token_ids]
    return torch.tensor(ids, dtype=torch.long, device=device)  # [T]


def build_positions(work: list[ScheduledSeq], device) -> torch.Tensor:
    pos = [p for w in work for p in range(w.start_pos, w.seq_len)]
    return torch.tensor(pos, dtype=torch.long, device=device)  # [T]


def build_slot_mapping(work: list[ScheduledSeq], block_size: int, device) -> torch.Tensor:
    slots = [w.block_table[p // block_size] * block_size + p % block_size
             for w in work for p in range(w.start_pos, w.seq_len)]
    return torch.tensor(slots, dtype=torch.long, device=device)  # [T]


def build_query_start_loc(work: list[ScheduledSeq]) -> list[int]:
    loc = [0]
    for w in work:
        loc.append(loc[-1] + len(w.token_ids))
    return loc  # [B+1]


def build_block_tables(work: list[ScheduledSeq], device) -> torch.Tensor:
    width = max(len(w.block_table) for w in work)
    rows = [w.block_table + [0] * (width - len(w.block_table)) for w in work]
    return torch.tensor(rows, dtype=torch.int32, device=device)  # [B, max_blocks]


def build_logits_indices(query_start_loc: list[int], device) -> torch.Tensor:
    return torch.tensor([end - 1 for end in query_start_loc[1:]], dtype=torch.long,
                        device=device)  # [B]: last new token of each sequence


def build_attention_metadata(work: list[ScheduledSeq], block_size: int,
                             device) -> AttentionMetadata:
    qsl = build_query_start_loc(work)
    seq_lens = [w.seq_len for w in work]
    return AttentionMetadata(
        slot_mapping=build_slot_mapping(work, block_size, device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=build_block_tables(work, device),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
        max_query_len=max(len(w.token_ids) for w in work),
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )
