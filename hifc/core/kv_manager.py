"""Block tables of the sequences that hold GPU KV blocks."""
from __future__ import annotations

import enum

from hifc.core.block_pool import BlockPool


class AllocStatus(enum.Enum):
    OK = "ok"  # can allocate now
    LATER = "later"  # not enough free blocks now
    NEVER = "never"  # more blocks than the pool holds


class KVCacheManager:
    """Maps sequence ids to lists of GPU block ids. Checks never change state."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self._block_tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_blocks

    def block_table(self, seq_id: str) -> list[int]:
        return self._block_tables.get(seq_id, [])

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq_id: str, num_tokens: int) -> int:
        """Blocks the sequence must add to hold ``num_tokens`` tokens."""
        return max(0, self.num_blocks_for(num_tokens) - len(self.block_table(seq_id)))

    def can_allocate(self, seq_id: str, num_tokens: int, use_watermark: bool = False) -> AllocStatus:
        """Whether the sequence can hold ``num_tokens`` tokens in total."""
        if self.num_blocks_for(num_tokens) > self.pool.num_blocks:
            return AllocStatus.NEVER
        need = self.num_new_blocks(seq_id, num_tokens)
        reserve = self.watermark_blocks if use_watermark else 0
        return AllocStatus.OK if self.pool.num_free_blocks - need >= reserve else AllocStatus.LATER

    def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow the sequence's block table to hold ``num_tokens`` tokens; returns the new ids."""
        new_ids = self.pool.allocate(self.num_new_blocks(seq_id, num_tokens))
        self._block_tables.setdefault(seq_id, []).extend(new_ids)
        return new_ids

    def free(self, seq_id: str) -> None:
        table = self._block_tables.pop(seq_id, None)
        if table:
            self.pool.free(table)
