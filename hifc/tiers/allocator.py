"""Flash-cache (FC) block allocator: pure bookkeeping, no torch, no I/O.

Policies
--------
``append``       a circular log. The next block handed out is the first free block at or after
                 the write head (the block after the last one handed out); blocks freed behind
                 the head are reclaimed when the head comes round again. Writes therefore never
                 jump backwards except when the head wraps from the end of the file to its start,
                 which keeps the SSD's writes sequential (the HiFC paper's policy).
``left-append``  the lowest-numbered free block (the paper's contrast; becomes random I/O under
                 churn).

Both take O(log N) time per block: free blocks are counted in a Fenwick tree, and "the k-th free
block" is found by binary lifting.

The allocator also keeps the trace of block ids in write order (``mark_written``), which the
write-amplification simulator consumes, and statistics over it.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

APPEND = "append"
LEFT_APPEND = "left-append"
POLICIES = (APPEND, LEFT_APPEND)


@dataclass(frozen=True)
class AllocatorStats:
    num_blocks: int
    num_free_blocks: int
    blocks_written: int
    sequential_runs: int  # maximal runs of writes to consecutive ids (N-1 -> 0 counts as one)
    wraps: int  # times the write head went from the end of the file back to its start
    backward_jumps: int  # writes to a lower id than the previous write that are not wraps

    @property
    def mean_run_blocks(self) -> float:
        return self.blocks_written / self.sequential_runs if self.sequential_runs else 0.0


class FCBlockAllocator:
    def __init__(self, num_blocks: int, policy: str = APPEND):
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if policy not in POLICIES:
            raise ValueError(f"unknown allocation policy {policy!r}; choose one of {list(POLICIES)}")
        self.num_blocks = num_blocks
        self.policy = policy
        self._free = bytearray(b"\x01") * num_blocks  # 1 = free
        self._tree = [0] * (num_blocks + 1)  # Fenwick tree over _free, 1-based
        for i in range(1, num_blocks + 1):  # linear-time build
            self._tree[i] += 1
            parent = i + (i & -i)
            if parent <= num_blocks:
                self._tree[parent] += self._tree[i]
        self._num_free = num_blocks
        self._top_bit = 1 << (num_blocks.bit_length() - 1)
        self._head = 0  # append: next position to look at
        self._trace = array("q")
        self._group_ends = array("q")  # trace index after each mark_written call (one swap-out)
        self._last_written = -1
        self._runs = 0
        self._wraps = 0
        self._backward = 0

    # -- queries (never change state) --------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self._num_free

    def is_allocated(self, block_id: int) -> bool:
        return 0 <= block_id < self.num_blocks and not self._free[block_id]

    # -- state changes -----------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` blocks in policy order; all or nothing."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"allocate(n) needs a non-negative int, got {n!r}")
        if n > self._num_free:
            raise ValueError(f"cannot allocate {n} FC blocks: only {self._num_free} of "
                             f"{self.num_blocks} are free (check can_allocate first)")
        out = []
        for _ in range(n):
            if self.policy == APPEND:
                before_head = self._prefix(self._head)  # free blocks in [0, head)
                rank = before_head + 1 if before_head < self._num_free else 1
            else:
                rank = 1
            block = self._kth_free(rank)
            self._take(block)
            self._head = (block + 1) % self.num_blocks
            out.append(block)
        return out

    def free(self, block_ids) -> None:
        ids = list(block_ids)
        seen = set()
        for block in ids:
            if not isinstance(block, int) or not 0 <= block < self.num_blocks:
                raise ValueError(f"FC block id {block!r} out of range [0, {self.num_blocks})")
            if self._free[block] or block in seen:
                raise ValueError(f"FC block {block} is not allocated (double free?)")
            seen.add(block)
        for block in ids:
            self._free[block] = 1
            self._num_free += 1
            self._update(block, +1)

    def take(self, block_ids) -> None:
        """Allocate these particular free blocks (all or nothing); the head does not move."""
        ids = list(block_ids)
        for block in ids:
            if not isinstance(block, int) or not 0 <= block < self.num_blocks:
                raise ValueError(f"FC block id {block!r} out of range [0, {self.num_blocks})")
            if not self._free[block]:
                raise ValueError(f"FC block {block} is not free")
        if len(set(ids)) != len(ids):
            raise ValueError("take() got the same FC block twice")
        for block in ids:
            self._take(block)

    def seek(self, block_id: int) -> None:
        """append: look at ``block_id`` first in the next allocation (a log reopened after a
        restart resumes after its newest record)."""
        if not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"FC block id {block_id!r} out of range [0, {self.num_blocks})")
        self._head = block_id

    def mark_written(self, block_ids) -> None:
        """Record that these allocated blocks were written, in this order (one swap-out)."""
        block_ids = list(block_ids)
        for block in block_ids:
            if not self.is_allocated(block):
                raise ValueError(f"FC block {block!r} is written but not allocated")
        for block in block_ids:
            prev = self._last_written
            if prev < 0 or block != (prev + 1) % self.num_blocks:
                self._runs += 1
            if block < prev:
                # Under append the head only moves forward, so a lower id means it wrapped.
                if self.policy == APPEND or (block == 0 and prev == self.num_blocks - 1):
                    self._wraps += 1
                else:
                    self._backward += 1
            self._trace.append(block)
            self._last_written = block
        if block_ids:
            self._group_ends.append(len(self._trace))

    # -- trace and statistics ----------------------------------------------------------------
    def trace(self) -> list[int]:
        """Block ids in write order."""
        return self._trace.tolist()

    def export_trace(self, path) -> int:
        """Write the trace as text for the WAF simulator (``hifc.analysis.swaptrace``): a header
        comment with the policy and ``num_blocks``, then one swap-out per line, its block ids in
        write order separated by spaces. Returns the number of block ids written."""
        with open(path, "w", encoding="ascii") as f:
            f.write("# hifc FC block write trace: policy=%s num_blocks=%d\n"
                    % (self.policy, self.num_blocks))
            start = 0
            for end in self._group_ends:
                f.write(" ".join(map(str, self._trace[start:end])) + "\n")
                start = end
        return len(self._trace)

    def stats(self) -> AllocatorStats:
        return AllocatorStats(num_blocks=self.num_blocks, num_free_blocks=self._num_free,
                              blocks_written=len(self._trace), sequential_runs=self._runs,
                              wraps=self._wraps, backward_jumps=self._backward)

    # -- Fenwick tree ------------------------------------------------------------------------
    def _take(self, block: int) -> None:
        self._free[block] = 0
        self._num_free -= 1
        self._update(block, -1)

    def _update(self, block: int, delta: int) -> None:
        i = block + 1
        tree, n = self._tree, self.num_blocks
        while i <= n:
            tree[i] += delta
            i += i & -i

    def _prefix(self, count: int) -> int:
        """Number of free blocks among ids [0, count)."""
        total, i, tree = 0, count, self._tree
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    def _kth_free(self, k: int) -> int:
        """Id of the k-th free block (1-based), by binary lifting over the tree."""
        pos, step, tree, n = 0, self._top_bit, self._tree, self.num_blocks
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] < k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        return pos  # 0-based id == 1-based position of the last prefix below k
