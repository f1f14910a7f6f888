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

Both take O(log N) time per block. The free blocks are a bitmap (one bit per block, in 64-bit
words) with a Fenwick tree over the words' free counts; "the k-th free block" is found by binary
lifting to its word, then within the word. Bookkeeping costs about N/8 + N/8 bytes (bitmap and
tree), so a tier of 15 million blocks (10 TiB of 700 KB blocks) takes about 4 MB.

The allocator also keeps the trace of block ids in write order (``mark_written``), which the
write-amplification simulator consumes, and statistics over all writes. The trace keeps only the
latest swap-outs that fit in ``trace_limit`` block ids, so a long-running server's memory stays
bounded; the statistics count every write.
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

APPEND = "append"
LEFT_APPEND = "left-append"
POLICIES = (APPEND, LEFT_APPEND)
DEFAULT_TRACE_LIMIT = 1 << 20  # block ids: 8 MiB plus ~80 B per swap-out; benchmarks write fewer
WORD_BITS = 64
_ALL_FREE = (1 << WORD_BITS) - 1


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
    def __init__(self, num_blocks: int, policy: str = APPEND,
                 trace_limit: int = DEFAULT_TRACE_LIMIT):
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if policy not in POLICIES:
            raise ValueError(f"unknown allocation policy {policy!r}; choose one of {list(POLICIES)}")
        if not isinstance(trace_limit, int) or isinstance(trace_limit, bool) or trace_limit < 0:
            raise ValueError(f"trace_limit must be a non-negative int, got {trace_limit!r}")
        self.num_blocks = num_blocks
        self.policy = policy
        self.trace_limit = trace_limit
        self._num_words = -(-num_blocks // WORD_BITS)
        self._words = _all_free_words(num_blocks, self._num_words)  # bit set = block free
        self._tree = _all_free_tree(num_blocks, self._num_words)  # Fenwick tree over words
        self._num_free = num_blocks
        self._top_bit = 1 << (self._num_words.bit_length() - 1)
        self._head = 0  # append: next position to look at
        self._trace: deque[array] = deque()  # the latest swap-outs' block ids, oldest first
        self._trace_len = 0
        self._blocks_written = 0
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
        return 0 <= block_id < self.num_blocks and not self._is_free(block_id)

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
            self._flip(block, -1)
            self._head = (block + 1) % self.num_blocks
            out.append(block)
        return out

    def free(self, block_ids) -> None:
        ids = list(block_ids)
        seen = set()
        for block in ids:
            if not isinstance(block, int) or not 0 <= block < self.num_blocks:
                raise ValueError(f"FC block id {block!r} out of range [0, {self.num_blocks})")
            if self._is_free(block) or block in seen:
                raise ValueError(f"FC block {block} is not allocated (double free?)")
            seen.add(block)
        for block in ids:
            self._flip(block, +1)

    def take(self, block_ids) -> None:
        """Allocate these particular free blocks (all or nothing); the head does not move."""
        ids = list(block_ids)
        for block in ids:
            if not isinstance(block, int) or not 0 <= block < self.num_blocks:
                raise ValueError(f"FC block id {block!r} out of range [0, {self.num_blocks})")
            if not self._is_free(block):
                raise ValueError(f"FC block {block} is not free")
        if len(set(ids)) != len(ids):
            raise ValueError("take() got the same FC block twice")
        for block in ids:
            self._flip(block, -1)

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
            self._last_written = block
        if block_ids:
            self._blocks_written += len(block_ids)
            self._keep_in_trace(array("q", block_ids))

    # -- trace and statistics ----------------------------------------------------------------
    def trace(self) -> list[int]:
        """Block ids in write order: those of the latest swap-outs that fit in ``trace_limit``
        ids (0 keeps none)."""
        return [block for group in self._trace for block in group]

    def export_trace(self, path) -> int:
        """Write the trace as text for the WAF simulator (``hifc.analysis.swaptrace``): a header
        comment with the policy and ``num_blocks``, then one swap-out per line, its block ids in
        write order separated by spaces. Returns the number of block ids written."""
        with open(path, "w", encoding="ascii") as f:
            f.write("# hifc FC block write trace: policy=%s num_blocks=%d\n"
                    % (self.policy, self.num_blocks))
            dropped = self._blocks_written - self._trace_len
            if dropped:
                f.write(f"# the {dropped} oldest block writes are not kept "
                        f"(trace_limit={self.trace_limit})\n")
            for group in self._trace:
                f.write(" ".join(map(str, group)) + "\n")
        return self._trace_len

    def stats(self) -> AllocatorStats:
        return AllocatorStats(num_blocks=self.num_blocks, num_free_blocks=self._num_free,
                              blocks_written=self._blocks_written, sequential_runs=self._runs,
                              wraps=self._wraps, backward_jumps=self._backward)

    def _keep_in_trace(self, group: array) -> None:
        self._trace.append(group)
        self._trace_len += len(group)
        while self._trace_len > self.trace_limit:
            self._trace_len -= len(self._trace.popleft())

    # -- bitmap and Fenwick tree over its words ----------------------------------------------
    def _is_free(self, block: int) -> bool:
        return bool(self._words[block // WORD_BITS] >> (block % WORD_BITS) & 1)

    def _flip(self, block: int, delta: int) -> None:
        """Mark ``block`` free (delta +1) or taken (-1); the caller checked its state."""
        word = block // WORD_BITS
        self._words[word] ^= 1 << (block % WORD_BITS)
        self._num_free += delta
        i, tree, n = word + 1, self._tree, self._num_words
        while i <= n:
            tree[i] += delta
            i += i & -i

    def _prefix(self, count: int) -> int:
        """Number of free blocks among ids [0, count)."""
        word, bits = divmod(count, WORD_BITS)
        total = (self._words[word] & ((1 << bits) - 1)).bit_count() if bits else 0
        i, tree = word, self._tree
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    def _kth_free(self, k: int) -> int:
        """Id of the k-th free block (1-based): binary lifting over the tree to its word, then
        the k-th set bit of that word."""
        pos, step, tree, n = 0, self._top_bit, self._tree, self._num_words
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] < k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        bits = self._words[pos]  # the word (0-based) after the last prefix below k
        for _ in range(k - 1):
            bits &= bits - 1  # drop the lowest free block
        return pos * WORD_BITS + (bits & -bits).bit_length() - 1


def _all_free_words(num_blocks: int, num_words: int) -> array:
    words = array("Q", [_ALL_FREE]) * num_words
    tail = num_blocks - (num_words - 1) * WORD_BITS  # blocks in the last word
    words[-1] = (1 << tail) - 1
    return words


def _all_free_tree(num_blocks: int, num_words: int) -> array:
    """The Fenwick tree (1-based) over the words' free counts when every block is free: node i
    covers the ``i & -i`` words ending at word i, built level by level with slice writes."""
    tree = array("q", bytes(8 * (num_words + 1)))
    span = 1
    while span <= num_words:
        nodes = range(span, num_words + 1, 2 * span)
        tree[span::2 * span] = array("q", [span * WORD_BITS]) * len(nodes)
        span *= 2
    tree[num_words] -= num_words * WORD_BITS - num_blocks  # the last word is partly past the end
    return tree
