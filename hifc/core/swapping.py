"""Preemption and swapping, the scheduler's part of it (torch-free; a mixin of
:class:`~hifc.core.scheduler.Scheduler`, which owns the queues and counters used here).

Preemption with shared blocks. A victim either drops all its blocks for recompute (each loses
one reference: blocks others share stay with them, its cached blocks stay cached), or swaps:
only the blocks it alone references and the flash prefix store lacks are written to the tier
(and freed as soon as the tier has staged them in its own memory, before the write ends: if
the write then fails, the sequence recomputes, as after any tier failure); its references to
blocks other sequences share are dropped at once, leaving holes in its table, and so are its
blocks that the store holds (their records are held: never overwritten meanwhile). At swap-in
the holes are filled by looking those hashes up again: in the GPU cache, else read from the
store (a prefix read beside the swap-in of the written blocks); if one is in neither, the
sequence is recomputed instead (its tier copy is freed). So a swapped sequence holds no GPU
block, and no shared block is ever written or freed as if it were owned.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from hifc.core.kv_manager import AllocStatus, KVCacheManager
from hifc.core.preemption import PreemptionMode, PreemptionPolicy
from hifc.core.scheduler_output import (
    PrefixRead, SchedulerLimits, SchedulerOutput, SwapOrder, TierBlocks,
)
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.core.store_level import StoreLevel


@dataclass
class TierCopy:
    """The tier copy of a swapped(-ing) sequence: ``positions`` of its table were written to
    ``tier_blocks``; ``by_hash`` positions held blocks that others share or that the prefix
    store holds (``held``: those records' tier blocks), found again by hash."""

    tier_blocks: list[int]
    owner: tuple[int, int]
    positions: list[int]
    by_hash: list[int]
    held: list[int] = field(default_factory=list)
    released: set[int] = field(default_factory=set)  # indices of positions whose GPU blocks
    # were freed once staged, before the swap-out's write ended
    parts: int = 0  # swap-in jobs (swap records, prefix reads) not finished yet
    parts_ok: bool = True
    num_read: int = 0  # blocks of the swap-in read from the prefix store


class SwapMixin:
    limits: SchedulerLimits
    kv: KVCacheManager
    policy: PreemptionPolicy
    tier: TierBlocks | None
    store: StoreLevel | None
    waiting: deque[Sequence]
    running: list[Sequence]
    loading: dict[str, Sequence]
    swapping_out: dict[str, Sequence]
    swapped: list[Sequence]
    swapping_in: dict[str, Sequence]
    _stored: dict[str, TierCopy]

    def _start_swap_ins(self, out: SchedulerOutput) -> None:
        while self.swapped:
            seq = self.swapped[0]
            rid = seq.request_id
            stored = self._stored[rid]
            hashes = seq.block_hashes
            reused = {p: block for p in stored.by_hash
                      if (block := self.kv.cached_block(hashes[p])) is not None}
            missing = [p for p in stored.by_hash if p not in reused]
            if missing and not self._all_stored([hashes[p] for p in missing]):
                self.swapped.pop(0)  # a block it shared is gone: recompute instead
                self._free_tier_copy(rid)
                self.kv.free(rid)
                self._requeue_for_recompute(seq)
                continue
            busy = self._busy()
            reserve = self._resume_reserve(seq, len(self.kv.block_table(rid))) if busy else 0
            if self.kv.can_fill_holes(rid, list(reused.values()), use_watermark=busy,
                                      reserve=reserve) is not AllocStatus.OK:
                break
            self.swapped.pop(0)
            new_blocks = self.kv.fill_holes(rid, reused)
            gpu_at = dict(zip(sorted(stored.positions + missing), new_blocks))
            seq.status = SequenceStatus.SWAPPING_IN
            self.swapping_in[rid] = seq
            if stored.tier_blocks:
                stored.parts += 1
                out.swap_in.append(SwapOrder(rid, stored.owner, [
                    (t, gpu_at[p]) for t, p in zip(stored.tier_blocks, stored.positions)]))
            if missing:
                stored.parts += 1
                stored.num_read = len(missing)
                out.prefix_reads.append(PrefixRead(rid, [(hashes[p], gpu_at[p])
                                                         for p in missing]))
            if not stored.parts:  # every block was still in the GPU cache
                self._end_swap_in(rid)

    def _busy(self) -> bool:
        """Whether other sequences hold or are taking GPU blocks to run."""
        return bool(self.running or self.swapping_in or self.loading)

    # ---- growth-aware resumption ------------------------------------------------------------
    def _resume_reserve(self, seq: Sequence, num_blocks: int) -> int:
        """Blocks to keep free when ``seq`` resumes holding ``num_blocks`` blocks: what it and
        every sequence running (or swapping in, or loading) beside it add over its next ``N``
        decode steps, ``N = min(block_size, tokens it has left)``. Without them the newest
        sequence, often the one resumed, would be preempted again within those steps."""
        steps = min(self.kv.block_size, self._tokens_left(seq))
        reserve = self._growth(seq, num_blocks, steps)
        for other in (*self.running, *self.swapping_in.values(), *self.loading.values()):
            reserve += self._growth(other, len(self.kv.block_table(other.request_id)), steps)
        return reserve

    def _tokens_left(self, seq: Sequence) -> int:
        """Tokens the sequence may still generate (max_tokens, the context length)."""
        left = self.limits.max_model_len - seq.num_tokens
        max_tokens = seq.sampling_params.max_tokens
        if max_tokens is not None:
            left = min(left, max_tokens - len(seq.output_token_ids))
        return max(0, left)

    def _growth(self, seq: Sequence, num_blocks: int, steps: int) -> int:
        """Blocks beyond ``num_blocks`` that the sequence's K/V needs after ``steps`` more
        decode steps (each computes one token's K/V; a prompt's rest included)."""
        num_kv_tokens = seq.num_tokens - 1 + min(steps, self._tokens_left(seq))
        return max(0, self.kv.num_blocks_for(num_kv_tokens) - num_blocks)

    def _all_stored(self, hashes: list[bytes]) -> bool:
        """Whether the flash prefix store holds every one of ``hashes`` now."""
        return self.store is not None and all(self.store.store.num_stored([h]) for h in hashes)

    # ---- preemption -----------------------------------------------------------------------
    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Preempt a running sequence; returns the GPU blocks that a swap-out will release."""
        self.num_preemptions += 1
        seq.num_preemptions += 1
        seq.generation += 1
        out.preempted_request_ids.append(seq.request_id)
        rid = seq.request_id
        owned = self.kv.exclusive_positions(rid)
        mode = self.policy.choose(len(owned), seq.num_computed_tokens)
        if mode is PreemptionMode.SWAP and owned and self.tier is not None:
            stored = self._swap_out(seq, owned, out)
            if stored is not None:
                return len(stored.positions)
        self.kv.free(rid)
        self._requeue_for_recompute(seq)
        return 0

    def _swap_out(self, seq: Sequence, owned: list[int],
                  out: SchedulerOutput) -> TierCopy | None:
        """Order the swap-out of the owned blocks the prefix store lacks (holding the records
        of those it has); None if the tier has no room."""
        rid = seq.request_id
        held_at = self._stored_positions(seq, owned)
        held = self.store.store.hold([seq.block_hashes[p] for p in held_at]) if held_at else []
        held_at = held_at[:len(held)]
        to_write = [p for p in owned if p not in set(held_at)]
        if not self.tier.can_reserve(len(to_write)):
            if held:
                self.store.store.release(held)
            return None
        table = self.kv.block_table(rid)
        gpu_blocks = [table[p] for p in to_write]
        written = set(to_write)
        by_hash = [p for p in range(len(table)) if p not in written]
        self.kv.release(rid, by_hash)  # others keep theirs; all are found again by hash
        stored = TierCopy(self.tier.reserve(len(to_write)), (seq.arrival, seq.generation),
                         to_write, by_hash, held)
        self._stored[rid] = stored
        seq.status = SequenceStatus.SWAPPING_OUT
        self.swapping_out[rid] = seq
        if to_write:
            out.swap_out.append(SwapOrder(rid, stored.owner,
                                          list(zip(gpu_blocks, stored.tier_blocks))))
        else:  # the store holds every block it owned
            self.swap_out_done(rid, True)
        return stored

    def _stored_positions(self, seq: Sequence, owned: list[int]) -> list[int]:
        """The owned positions of computed full blocks that the prefix store holds."""
        if self.store is None:
            return []
        num_full = min(len(seq.block_hashes), seq.num_computed_tokens // self.kv.block_size)
        num_stored = self.store.store.num_stored
        return [p for p in owned if p < num_full and num_stored([seq.block_hashes[p]])]

    def _requeue_for_recompute(self, seq: Sequence) -> None:
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_recomputed_sequences += 1

    def _free_tier_copy(self, request_id: str) -> None:
        stored = self._stored.pop(request_id, None)
        if stored is not None and self.tier is not None:
            self.tier.free(stored.tier_blocks)
            if stored.held:
                self.store.store.release(stored.held)

    # ---- swap completions (told by the engine) --------------------------------------------
    def _num_releasing(self) -> int:
        """GPU blocks that swap-outs in flight still hold (free once staged or written)."""
        return sum(len(stored.positions) - len(stored.released)
                   for stored in (self._stored[rid] for rid in self.swapping_out))

    def swap_out_staged(self, request_id: str, indices: list[int]) -> None:
        """The tier has copied the blocks of the swap-out order's pairs at ``indices`` into
        its own memory, and goes on writing them: their GPU blocks are free now. The sequence
        stays SWAPPING_OUT until ``swap_out_done``; if the write then fails, it recomputes."""
        stored = self._stored[request_id]
        new = [i for i in indices if i not in stored.released]
        stored.released.update(new)
        self.kv.release(request_id, [stored.positions[i] for i in new])
        self.swap_out_blocks_freed_staged += len(new)

    def swap_out_done(self, request_id: str, ok: bool) -> None:
        seq = self.swapping_out.pop(request_id)
        if seq.status.is_finished or not ok:
            self.kv.free(request_id)
            self._free_tier_copy(request_id)
            if not seq.status.is_finished:
                self.num_swap_failures += 1
                self._requeue_for_recompute(seq)
            return
        stored = self._stored[request_id]
        # the write is over: the GPU copy of the blocks not freed when staged is not needed
        self.kv.release(request_id, [p for i, p in enumerate(stored.positions)
                                     if i not in stored.released])
        self.swap_out_blocks += len(stored.tier_blocks)
        seq.status = SequenceStatus.SWAPPED
        bisect.insort(self.swapped, seq, key=lambda s: s.arrival)

    def swap_in_done(self, request_id: str, ok: bool) -> None:
        self._swap_in_part_done(request_id, ok)

    def _swap_in_part_done(self, request_id: str, ok: bool) -> None:
        """One job of a swap-in ended; once all have, the sequence runs (or recomputes)."""
        stored = self._stored[request_id]
        stored.parts -= 1
        stored.parts_ok = stored.parts_ok and ok
        if not stored.parts:
            self._end_swap_in(request_id)

    def _end_swap_in(self, request_id: str) -> None:
        stored = self._stored[request_id]
        seq = self.swapping_in.pop(request_id)
        self._free_tier_copy(request_id)
        if seq.status.is_finished or not stored.parts_ok:
            self.kv.free(request_id)
            if not seq.status.is_finished:
                self.num_swap_failures += 1
                self._requeue_for_recompute(seq)
            return
        self.swap_in_blocks += len(stored.tier_blocks)
        self.kv.cache_blocks(seq, seq.num_computed_tokens)  # shareable again
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)
