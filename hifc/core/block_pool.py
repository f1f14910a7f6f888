"""GPU KV block ids: reference counts, the prefix cache's hash map, and free lists (torch-free).

A block is in exactly one of three states:
- in use: referenced by one or more sequences (``ref_count > 0``); a full block may also be
  cached (named by its content hash, so that other sequences can share it);
- free and cached: no reference, but its hash still names it; it waits in an LRU list and is
  evicted (its hash dropped) only when the pool needs a block and no uncached one is free;
- free: no reference, no hash.

``num_free_blocks`` counts both kinds of free block: all of them can be handed out. Every
operation is O(1) per block.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from typing import Callable

EvictListener = Callable[[bytes, int], None]


class BlockPool:
    """Block ids 0..num_blocks-1. ``on_evict(block_hash, block_id)`` (optional) is told when a
    cached block is about to be reused for other content: the hook for a second cache level."""

    def __init__(self, num_blocks: int, on_evict: EvictListener | None = None):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.on_evict = on_evict
        self._ref_count = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}  # hash -> block, for full blocks
        self._free: deque[int] = deque(range(num_blocks))  # free, uncached: handed out first
        self._lru: OrderedDict[int, None] = OrderedDict()  # free, cached: oldest first
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out: free ones and free cached ones."""
        return len(self._free) + len(self._lru)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._lru)

    @property
    def num_uncached_free_blocks(self) -> int:
        """Free blocks handed out before any cached block is evicted."""
        return len(self._free)

    def oldest_cached_free(self, n: int) -> list[int]:
        """The ``n`` free cached blocks next in line for eviction, oldest first."""
        return list(itertools.islice(self._lru, max(0, n)))

    def cached_blocks(self) -> list[tuple[int, bytes]]:
        """Every cached block with its hash, in the order they were cached (a block's parent
        usually before it)."""
        return [(block, block_hash) for block_hash, block in self._cached.items()]

    def ref_count(self, block: int) -> int:
        return self._ref_count[block]

    def block_hash(self, block: int) -> bytes | None:
        return self._hash[block]

    def lookup(self, block_hash: bytes) -> int | None:
        """The block cached under ``block_hash``, if any (a check: changes nothing)."""
        return self._cached.get(block_hash)

    def num_unreferenced(self, blocks: list[int]) -> int:
        """How many of these (cached) blocks are free: taking them uses free blocks."""
        return sum(1 for b in blocks if self._ref_count[b] == 0)

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks, each with one reference: free uncached blocks first, then the least
        recently freed cached blocks (evicted: their hashes are dropped)."""
        if n > self.num_free_blocks:
            raise RuntimeError(f"block pool exhausted: asked for {n}, {self.num_free_blocks} free "
                               "(callers must check can_allocate first)")
        ids = []
        for _ in range(n):
            block = self._free.popleft() if self._free else self._evict_oldest()
            self._ref_count[block] = 1
            ids.append(block)
        return ids

    def _evict_oldest(self) -> int:
        block, _ = self._lru.popitem(last=False)
        block_hash = self._hash[block]
        self._hash[block] = None
        del self._cached[block_hash]
        self.num_evictions += 1
        if self.on_evict is not None:
            self.on_evict(block_hash, block)
        return block

    def take(self, blocks: list[int]) -> None:
        """Add a reference to each of these cached blocks (a prefix cache hit)."""
        for block in blocks:
            if self._hash[block] is None:
                raise RuntimeError(f"block {block} is not cached: only cached blocks are shared")
            if self._ref_count[block] == 0:
                del self._lru[block]
            self._ref_count[block] += 1

    def release(self, blocks: list[int], evict_first: bool = False) -> None:
        """Drop one reference from each block. Blocks left unreferenced become free; cached
        ones join the LRU list in the order given (the first is evicted first), at its newest
        end, or with ``evict_first`` at its oldest end (their content is kept elsewhere, say
        in the flash store: the cheapest blocks to evict)."""
        front = []
        for block in blocks:
            if self._ref_count[block] <= 0:
                raise RuntimeError(f"block {block} freed twice")
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                if self._hash[block] is None:
                    self._free.append(block)
                else:
                    self._lru[block] = None
                    front.append(block)
        if evict_first:
            for block in reversed(front):
                self._lru.move_to_end(block, last=False)

    def cache(self, block: int, block_hash: bytes) -> bool:
        """Name an in-use full block by its content hash so that other sequences can share it.
        Returns False (and leaves the block uncached) when another block already holds that
        content, or the block is already cached."""
        if self._ref_count[block] == 0:
            raise RuntimeError(f"block {block} is free: only blocks in use are cached")
        if self._hash[block] is not None or block_hash in self._cached:
            return False
        self._hash[block] = block_hash
        self._cached[block_hash] = block
        return True
