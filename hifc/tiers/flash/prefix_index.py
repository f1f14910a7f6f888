"""The flash prefix index: which tier blocks hold prefix records, and the log's space (torch-free).

Swap records and prefix records share one log, the cache file. A tier block is, at any time:

* *empty*: free in the allocator, no record worth keeping;
* *reserved*: allocated to a caller's swap-out, or to a prefix write in flight;
* *cached*: holds a published prefix record (in the index), findable by (salt, hash);
* *pinned*: cached with reads in flight or held by the caller (never overwritten until the
  reads end and the holds are released).

Where cached blocks sit in the allocator depends on the allocation policy, so that the log keeps
its order and a swap reservation never fails because the log is full of prefix records:

``append``       cached blocks are *free* in the allocator. The write head hands them out as it
                 comes round, in log order, and the record is dropped from the index right then
                 (the log itself is the eviction: the oldest records are overwritten first, and
                 writes stay sequential). A pinned block is taken out of the allocator while its
                 reads are in flight, so the head skips it.
``left-append``  cached blocks stay *allocated*, so the lowest free block is an empty one. When a
                 reservation needs more blocks than are free, the oldest unpinned records are
                 reclaimed first (dropped and freed), as the log would overwrite them.

Keys are ``salt + hash`` (two opaque 32-byte strings): lookups of one model never see another
model's records, which are simply overwritten in their turn.
"""
from __future__ import annotations

from collections import Counter

from hifc.tiers.allocator import LEFT_APPEND, FCBlockAllocator


def key_of(salt: bytes, block_hash: bytes) -> bytes:
    return salt + block_hash


class PrefixIndex:
    def __init__(self, allocator: FCBlockAllocator):
        self.allocator = allocator
        self.hold_cached = allocator.policy == LEFT_APPEND
        self._block_of: dict[bytes, int] = {}  # key -> tier block holding its record
        self._key_at: dict[int, bytes] = {}  # tier block -> key, oldest record first
        self._pins: Counter[int] = Counter()  # tier block -> reads in flight
        self._writing: dict[bytes, int] = {}  # key -> tier block of its write in flight
        self._write_blocks: set[int] = set()  # the blocks of those writes

    # -- queries (never change state) --------------------------------------------------------
    def __len__(self) -> int:
        return len(self._block_of)

    def __contains__(self, key: bytes) -> bool:
        return key in self._block_of

    def block_of(self, key: bytes) -> int | None:
        return self._block_of.get(key)

    def is_writing(self, key: bytes) -> bool:
        return key in self._writing

    def owns(self, block: int) -> bool:
        """The block holds a record, is pinned or is being written by the prefix store (never a
        caller's to free or reuse)."""
        return block in self._key_at or self._pins[block] > 0 or block in self._write_blocks

    def leading_hits(self, salt: bytes, hashes) -> int:
        """How many leading hashes have a record of this salt."""
        count = 0
        for block_hash in hashes:
            if key_of(salt, block_hash) not in self._block_of:
                break
            count += 1
        return count

    @property
    def num_pinned(self) -> int:
        return len(self._pins)

    @property
    def num_reclaimable(self) -> int:
        """Cached blocks a reservation may take beyond the allocator's free blocks."""
        if not self.hold_cached:
            return 0  # they are free in the allocator already
        return len(self._key_at) - sum(1 for b in self._pins if b in self._key_at)

    @property
    def num_reservable(self) -> int:
        return self.allocator.num_free_blocks + self.num_reclaimable

    def can_reserve(self, n: int) -> bool:
        return 0 <= n <= self.num_reservable

    # -- space -------------------------------------------------------------------------------
    def reserve(self, n: int) -> list[int]:
        """``n`` blocks in policy order, overwriting prefix records where the log says so."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"reserve(n) needs a non-negative int, got {n!r}")
        if n > self.num_reservable:
            raise ValueError(f"cannot reserve {n} FC blocks: only {self.num_reservable} of "
                             f"{self.allocator.num_blocks} are free (check can_reserve first)")
        if self.hold_cached:
            self._reclaim(n - self.allocator.num_free_blocks)
        ids = self.allocator.allocate(n)
        if not self.hold_cached:
            for block in ids:
                if block in self._key_at:
                    self._forget(block)
        return ids

    def _reclaim(self, count: int) -> None:
        """left-append: drop and free the ``count`` oldest unpinned records."""
        if count <= 0:
            return
        victims = []
        for block in self._key_at:
            if not self._pins[block]:
                victims.append(block)
                if len(victims) == count:
                    break
        for block in victims:
            self._forget(block)
        self.allocator.free(victims)

    # -- records -----------------------------------------------------------------------------
    def load(self, records) -> None:
        """Index records found in the file: ``(block, key)`` pairs, oldest first, each block
        and key at most once, on a fresh allocator (every block free)."""
        for block, key in records:
            self._block_of[key] = block
            self._key_at[block] = key
        if self.hold_cached:
            self.allocator.take(list(self._key_at))

    def begin_write(self, key: bytes, block: int) -> None:
        """A write of ``key`` to the reserved ``block`` is in flight."""
        self._writing[key] = block
        self._write_blocks.add(block)

    def end_write(self, key: bytes, ok: bool) -> None:
        """The write of ``key`` ended: publish its record, or give its block back."""
        block = self._writing.pop(key)
        self._write_blocks.discard(block)
        if not ok:
            self.allocator.free([block])
            return
        old = self._block_of.get(key)
        if old is not None:
            self.drop(old)  # a newer copy replaces it
        self._block_of[key] = block
        self._key_at[block] = key
        if not self.hold_cached:
            self.allocator.free([block])

    def pin(self, block: int) -> None:
        """A read of this cached block is in flight, or a caller holds it: it must not be
        overwritten until :meth:`unpin`."""
        if block not in self._key_at:
            raise ValueError(f"FC block {block} holds no indexed prefix record")
        if not self._pins[block] and not self.hold_cached:
            self.allocator.take([block])
        self._pins[block] += 1

    def unpin(self, block: int) -> None:
        self._pins[block] -= 1
        if self._pins[block]:
            return
        del self._pins[block]
        if block not in self._key_at or not self.hold_cached:
            self.allocator.free([block])  # back in the log (cached, or empty if dropped)

    def drop(self, block: int) -> None:
        """Forget the record at ``block`` (it failed verification, or was replaced). A pinned
        block is freed when its last read ends."""
        if block not in self._key_at:
            return
        self._forget(block)
        if self.hold_cached and not self._pins[block]:
            self.allocator.free([block])

    def _forget(self, block: int) -> None:
        del self._block_of[self._key_at.pop(block)]
