"""Block tables of the sequences that hold GPU KV blocks, and the GPU prefix cache.

With a model salt (prefix caching on), every full block a sequence computes is cached under
its chained content hash (``hifc.core.block_hash``); a new sequence starts from the longest run
of cached blocks that matches its tokens and takes a reference on each. Blocks are shared by
reference count and return to the pool when the last reference goes: cached ones stay cached,
least recently freed first to be evicted (``hifc.core.block_pool``).

A swapped-out sequence's table keeps its length, with ``HOLE`` where a block was given up;
``fill_holes`` gives them blocks again when it swaps in. Checks (``can_*``, ``cached_prefix``,
``cached_block``) never change state.

A table object (``block_table``, which the scheduler hands the runner without copying) only
ever grows: giving up or refilling blocks replaces the sequence's table with a new object.
"""
from __future__ import annotations

import enum

from hifc.core.block_hash import chain_block_hashes
from hifc.core.block_pool import BlockPool, EvictListener
from hifc.core.sequence import Sequence

HOLE = -1  # a block table entry whose block was given up while the sequence is swapped


class AllocStatus(enum.Enum):
    OK = "ok"  # can allocate now
    LATER = "later"  # not enough free blocks now
    NEVER = "never"  # more blocks than the pool holds


class KVCacheManager:
    """Maps sequence ids to lists of GPU block ids. ``salt`` (32 bytes, the model's identity)
    turns prefix caching on; None leaves every block private to its sequence."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01,
                 salt: bytes | None = None, on_evict: EvictListener | None = None):
        self.pool = BlockPool(num_blocks, on_evict)
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.salt = salt
        self._block_tables: dict[str, list[int]] = {}
        self._num_cached: dict[str, int] = {}  # leading table entries already offered to the cache
        self._num_holes: dict[str, int] = {}  # HOLE entries of swapped sequences' tables

    @property
    def prefix_caching(self) -> bool:
        return self.salt is not None

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated, cached-and-free ones included."""
        return self.pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return self.pool.num_cached_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_blocks

    def block_table(self, seq_id: str) -> list[int]:
        return self._block_tables.get(seq_id, [])

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq_id: str, num_tokens: int) -> int:
        """Blocks the sequence must add (holes included) to hold ``num_tokens`` tokens."""
        holes = self._num_holes.get(seq_id, 0)
        return holes + max(0, self.num_blocks_for(num_tokens) - len(self.block_table(seq_id)))

    def holds(self, seq_id: str, num_tokens: int) -> bool:
        """The sequence's blocks already hold ``num_tokens`` tokens (a decode with room in its
        last block): allocating for them takes nothing."""
        table = self._block_tables.get(seq_id)
        return (table is not None and len(table) * self.block_size >= num_tokens
                and seq_id not in self._num_holes)

    # ---- prefix cache ---------------------------------------------------------------------
    def block_hashes(self, seq: Sequence) -> list[bytes]:
        """The hashes of the sequence's full blocks (kept on the sequence; each block is
        hashed once, when its last token is known)."""
        hashes, size = seq.block_hashes, self.block_size
        if self.salt is not None and seq.num_tokens >= (len(hashes) + 1) * size:
            start, end = len(hashes) * size, seq.num_tokens // size * size
            parent = hashes[-1] if hashes else self.salt
            hashes += chain_block_hashes(parent, seq.token_ids(start, end), size)
        return hashes

    def reuses_prefix(self, seq: Sequence) -> bool:
        """Whether ``seq`` may start from KV computed before (the GPU prefix cache or the flash
        prefix store): not when it asks for prompt logprobs, which come from computing every
        prompt token (vLLM's rule)."""
        return self.salt is not None and seq.sampling_params.prompt_logprobs is None

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks of the longest prefix of ``seq`` (a sequence without blocks) that
        the cache holds; at least the last token is left to compute (``reuses_prefix``)."""
        if not self.reuses_prefix(seq):
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hit = []
        for block_hash in self.block_hashes(seq)[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def cached_block(self, block_hash: bytes) -> int | None:
        """The block cached under ``block_hash``, if any."""
        return self.pool.lookup(block_hash)

    def cache_blocks(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Cache the sequence's full blocks among its first ``num_computed_tokens`` tokens (their
        K/V is computed, or is being computed in the step being scheduled), so that other
        sequences can share them. A block whose last token is still pending (sampled by a step
        in flight) is cached later: its hash needs that token."""
        if self.salt is None:
            return
        seq_id = seq.request_id
        num_full = min(num_computed_tokens, seq.num_tokens) // self.block_size
        start = self._num_cached.get(seq_id, 0)
        if num_full <= start:
            return
        table, hashes = self._block_tables[seq_id], self.block_hashes(seq)
        for pos in range(start, num_full):
            self.pool.cache(table[pos], hashes[pos])
        self._num_cached[seq_id] = num_full

    # ---- allocation -----------------------------------------------------------------------
    def can_allocate(self, seq_id: str, num_tokens: int, use_watermark: bool = False,
                     prefix: list[int] = (), reserve: int = 0) -> AllocStatus:
        """Whether the sequence can hold ``num_tokens`` tokens in total, starting (if it holds
        no block yet) from the cached ``prefix`` blocks, and leave ``reserve`` blocks free
        (beyond the watermark, if used)."""
        if self.num_blocks_for(num_tokens) > self.pool.num_blocks:
            return AllocStatus.NEVER
        need = self.num_new_blocks(seq_id, num_tokens) - len(prefix)
        return self._fits(need + self.pool.num_unreferenced(prefix), use_watermark, reserve)

    def _fits(self, num_blocks: int, use_watermark: bool, reserve: int = 0) -> AllocStatus:
        keep = reserve + (self.watermark_blocks if use_watermark else 0)
        ok = self.pool.num_free_blocks - num_blocks >= keep
        return AllocStatus.OK if ok else AllocStatus.LATER

    def allocate(self, seq_id: str, num_tokens: int, prefix: list[int] = ()) -> list[int]:
        """Grow the sequence's block table to hold ``num_tokens`` tokens (a new sequence first
        shares the cached ``prefix`` blocks); returns the newly allocated ids."""
        table = self._block_tables.setdefault(seq_id, [])
        if prefix:
            if table:
                raise RuntimeError(f"{seq_id} already holds blocks: a cached prefix starts a table")
            self.pool.take(list(prefix))
            table.extend(prefix)
            self._num_cached[seq_id] = len(prefix)
        new_ids = self.pool.allocate(max(0, self.num_blocks_for(num_tokens) - len(table)))
        table.extend(new_ids)
        return new_ids

    def free(self, seq_id: str) -> None:
        """Drop the sequence's references; its cached blocks stay cached while the pool allows.
        The last block is freed first, so a prefix that other sequences may share is evicted
        last."""
        table = self._block_tables.pop(seq_id, None)
        self._num_cached.pop(seq_id, None)
        self._num_holes.pop(seq_id, None)
        if table:
            self.pool.release([b for b in reversed(table) if b != HOLE])

    # ---- swapping ---------------------------------------------------------------------------
    def exclusive_positions(self, seq_id: str) -> list[int]:
        """Table positions whose block no other sequence references (what a swap-out writes)."""
        return [pos for pos, block in enumerate(self.block_table(seq_id))
                if block != HOLE and self.pool.ref_count(block) == 1]

    def release(self, seq_id: str, positions: list[int]) -> None:
        """Give up the blocks at ``positions`` (the sequence is swapped out), leaving holes."""
        if not positions:
            return
        table = list(self._block_tables[seq_id])  # a new object: tables only grow in place
        self.pool.release([table[pos] for pos in reversed(positions)])
        for pos in positions:
            table[pos] = HOLE
        self._block_tables[seq_id] = table
        self._num_holes[seq_id] = self._num_holes.get(seq_id, 0) + len(positions)
        self._num_cached[seq_id] = min(self._num_cached.get(seq_id, 0), min(positions))

    def can_fill_holes(self, seq_id: str, reused: list[int], use_watermark: bool,
                       reserve: int = 0) -> AllocStatus:
        """Whether the holes can be filled: ``reused`` cached blocks for some, new ones for the
        rest (leaving ``reserve`` blocks free beyond the watermark, if used)."""
        need = self._num_holes.get(seq_id, 0) - len(reused)
        return self._fits(need + self.pool.num_unreferenced(reused), use_watermark, reserve)

    def fill_holes(self, seq_id: str, reused: dict[int, int]) -> list[int]:
        """Put the cached block ``reused[pos]`` at each of those positions and a new block in
        every other hole; returns the new blocks in table order."""
        table = list(self._block_tables[seq_id])  # a new object: tables only grow in place
        self._block_tables[seq_id] = table
        self.pool.take(list(reused.values()))
        for pos, block in reused.items():
            table[pos] = block
        holes = [pos for pos, block in enumerate(table) if block == HOLE]
        new_ids = self.pool.allocate(len(holes))
        for pos, block in zip(holes, new_ids):
            table[pos] = block
        self._num_holes.pop(seq_id, None)
        return new_ids
