"""The flash prefix store as the GPU prefix cache's second level: the scheduler's side (torch-free).

What the scheduler asks of the store (``PrefixStoreView``, bound to one model salt by the
engine) and what it decides about it:

* admission: after the GPU hit, how many of the following block hashes the store holds, and
  through the cost rule (:class:`~hifc.core.prefix_policy.PrefixReadPolicy`) how many to read;
* writes (``write_mode``): ``evicted`` writes a cached block before the GPU evicts it: at the
  start of each step's scheduling, the free cached blocks next in line for eviction (as many as the coming steps may
  take, ``lookahead_blocks`` less the uncached free blocks and the writes in flight) that the
  store lacks; ``all``
  writes every full block once computed (in the step after the one that computed it). A block
  being written holds a reference (it is not reused before its write completes); the store
  never holds a hash twice. With ``evicted``, a written block goes back to the oldest end of
  the LRU list: stored, it is the cheapest to evict;
* at a clean shutdown, every cached block the store lacks (:meth:`flush_candidates`).
"""
from __future__ import annotations

from collections import Counter
from typing import Protocol

from hifc.core.block_pool import BlockPool
from hifc.core.prefix_policy import PrefixReadPolicy
from hifc.options import check_choice

WRITE_MODES = ("evicted", "all")


class PrefixStoreView(Protocol):
    """The flash prefix store under one model salt."""

    def num_stored(self, hashes: list[bytes]) -> int:
        """How many leading ``hashes`` can be read now (changes and counts nothing)."""

    def hold(self, hashes: list[bytes]) -> list[int]:
        """Keep the records of the leading stored ``hashes``; their tier blocks are the handle."""

    def release(self, tier_blocks: list[int]) -> None: ...


class StoreLevel:
    def __init__(self, store: PrefixStoreView, policy: PrefixReadPolicy, write_mode: str,
                 pool: BlockPool, lookahead_blocks: int):
        check_choice("write_mode", write_mode, WRITE_MODES)
        self.store = store
        self.policy = policy
        self.write_mode = write_mode
        self.pool = pool
        self.block_size = policy.block_size
        self.lookahead_blocks = lookahead_blocks
        self._writing: dict[int, bytes] = {}  # GPU block -> hash, write in flight
        self._stored: dict[int, bytes] = {}  # GPU block -> hash the store holds (while cached)
        self._computed: list[tuple[int, bytes]] = []  # 'all': blocks computed, not offered yet
        self.counts: Counter[str] = Counter()
        pool.on_evict = self._on_evict

    # ---- reads at admission ---------------------------------------------------------------
    def plan_read(self, hashes: list[bytes]) -> tuple[int, int]:
        """(blocks found, blocks to read) among ``hashes``, the blocks after the GPU hit."""
        found = self.store.num_stored(hashes) if hashes else 0
        return found, self.policy.blocks_to_read(found)

    def count_admission(self, num_queried: int, num_found: int, num_read: int) -> None:
        """Count an admitted sequence's lookup (in tokens) and the rule's choice."""
        size = self.block_size
        self.counts["queries"] += num_queried * size
        self.counts["hits"] += num_found * size
        self.counts["recomputed"] += (num_found - num_read) * size
        self.counts["reads"] += num_read > 0

    def count_read(self, num_asked: int, num_ok: int) -> None:
        self.counts["read_tokens"] += num_ok * self.block_size
        self.counts["read_failures"] += num_ok < num_asked

    # ---- writes -----------------------------------------------------------------------------
    def note_computed(self, blocks: list[tuple[int, bytes]]) -> None:
        """Full blocks (GPU block, hash) whose K/V a step computed (``all`` writes them)."""
        if self.write_mode == "all":
            self._computed += blocks

    def select_writes(self) -> list[tuple[int, bytes]]:
        """The (GPU block, hash) pairs to write now; each holds a reference until
        :meth:`write_done`."""
        if self.write_mode == "all":
            candidates, self._computed = self._computed, []
        else:
            window = (self.lookahead_blocks - self.pool.num_uncached_free_blocks
                      - len(self._writing))
            candidates = [(b, self.pool.block_hash(b)) for b in self.pool.oldest_cached_free(window)]
        return self._take(self._unstored(candidates))

    def flush_candidates(self) -> list[tuple[int, bytes]]:
        """Every cached GPU block the store lacks and that no write is moving (shutdown)."""
        return self._unstored(self.pool.cached_blocks())

    def _unstored(self, candidates: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """The candidates still cached under their hash that the store lacks (those it holds
        are remembered, so they are not looked up again)."""
        todo = []
        for block, block_hash in candidates:
            if (self.pool.block_hash(block) != block_hash or block in self._writing
                    or self._stored.get(block) == block_hash):
                continue
            if self.store.num_stored([block_hash]):
                self._stored[block] = block_hash
            else:
                todo.append((block, block_hash))
        return todo

    def _take(self, pairs: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        self.pool.take([block for block, _ in pairs])
        self._writing.update(pairs)
        return pairs

    def begin_flush(self, pairs: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Hold ``pairs`` (from :meth:`flush_candidates`) for a write, as :meth:`select_writes`
        does."""
        return self._take(pairs)

    def write_done(self, pairs: list[tuple[int, bytes]], written: bool) -> None:
        """The write of ``pairs`` ended (or the store declined them): drop their references."""
        for block, block_hash in pairs:
            del self._writing[block]
            if written:
                self._stored[block] = block_hash
        self.pool.release([block for block, _ in pairs],
                          evict_first=written and self.write_mode == "evicted")

    @property
    def num_releasing(self) -> int:
        """GPU blocks that become free when the writes in flight end (``evicted`` writes free
        blocks)."""
        return len(self._writing) if self.write_mode == "evicted" else 0

    def _on_evict(self, block_hash: bytes, block: int) -> None:
        if self._stored.pop(block, None) != block_hash:
            self.counts["evicted_unstored"] += 1

    # ---- results ----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        c = self.counts
        return {"prefix_store_queries": c["queries"], "prefix_store_hits": c["hits"],
                "prefix_store_recomputed": c["recomputed"],
                "prefix_store_read_tokens": c["read_tokens"],
                "prefix_store_reads": c["reads"],
                "prefix_store_read_failures": c["read_failures"],
                "prefix_store_evicted_unstored": c["evicted_unstored"]}
