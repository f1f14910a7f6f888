"""A pool of fixed-size KV block ids (one id space per tier)."""
from __future__ import annotations

from collections import deque


class BlockPool:
    """Free list of block ids 0..num_blocks-1. Freed blocks are reused first-in, first-out."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._is_free = [True] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"block pool exhausted: asked for {n}, {len(self._free)} free "
                               "(callers must check can_allocate first)")
        ids = [self._free.popleft() for _ in range(n)]
        for i in ids:
            self._is_free[i] = False
        return ids

    def free(self, ids: list[int]) -> None:
        for i in ids:
            if self._is_free[i]:
                raise RuntimeError(f"block {i} freed twice")
            self._is_free[i] = True
            self._free.append(i)
