"""Continuous batching: every step decodes the running sequences and admits waiting prompts.

Policy (vLLM-style, no chunked prefill):
1. Each running sequence gets one decode token, in admission order. When the pool has no block
   for it, the newest running sequence is preempted (possibly the one being scheduled) until it
   fits. A preempted sequence either swaps its KV out to the tier (its GPU blocks are freed only
   when the write completes; sequences waiting for those blocks sit out a step meanwhile) or is
   dropped for recompute (back to the front of the waiting queue).
2. If nothing was preempted in this step, swapped sequences are swapped back in (oldest first)
   while free blocks stay above a watermark: the read is started at once and overlaps the
   following steps; the sequence decodes again once the read has completed.
3. Only when no sequence is left swapped, waiting sequences are admitted in order while the
   sequence and token budgets and the free blocks (above the watermark) allow. A prompt is
   prefilled in one step; a recomputed sequence is re-prefilled over prompt + generated tokens.

The scheduler speaks to the runtime only through ``SchedulerOutput`` and learns of finished
swaps through ``swap_out_done`` / ``swap_in_done``, called by the engine.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from hifc.core.kv_manager import AllocStatus, KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.preemption import PreemptionMode, PreemptionPolicy
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.sampling_params import SamplingParams


class TierBlocks(Protocol):
    """What the scheduler needs of a swap tier's block space."""

    def can_reserve(self, n: int) -> bool: ...
    def reserve(self, n: int) -> list[int]: ...
    def free(self, ids: list[int]) -> None: ...


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's work in a step: compute K/V for ``token_ids`` at positions
    ``start_pos..start_pos+len-1`` and sample the next token from the last one."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sampling_params: SamplingParams

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class SwapOrder:
    """Move one sequence's KV blocks. Swap-out pairs are (gpu, tier); swap-in pairs are
    (tier, gpu). ``owner`` = (sequence number, generation) tags the stored records."""

    request_id: str
    owner: tuple[int, int]
    pairs: list[tuple[int, int]]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # ended since the last step
    swap_out: list[SwapOrder] = field(default_factory=list)
    swap_in: list[SwapOrder] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled if len(s.token_ids) > 1)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass
class _Stored:
    tier_blocks: list[int]
    owner: tuple[int, int]


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv_manager: KVCacheManager,
                 policy: PreemptionPolicy, tier: TierBlocks | None = None):
        self.limits = limits
        self.kv = kv_manager
        self.policy = policy
        self.tier = tier
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapping_out: dict[str, Sequence] = {}
        self.swapped: list[Sequence] = []  # ordered by arrival
        self.swapping_in: dict[str, Sequence] = {}
        self._stored: dict[str, _Stored] = {}  # tier copy of swapped(-ing) sequences
        self._finished_since_step: list[str] = []
        self.num_preemptions = 0
        self.num_recomputed_sequences = 0
        self.num_swap_failures = 0
        self.swap_out_blocks = 0
        self.swap_in_blocks = 0

    # ---- requests -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if self.kv.can_allocate(seq.request_id, seq.num_prompt_tokens + 1) is AllocStatus.NEVER:
            raise ValueError(f"prompt of {seq.num_prompt_tokens} tokens needs more KV blocks than "
                             f"the pool holds ({self.kv.num_total_blocks})")
        self.waiting.append(seq)

    def is_tracking(self, request_id: str) -> bool:
        """True while any state (queue entry, blocks, I/O in flight) refers to the request."""
        return (request_id in self._stored or request_id in self.swapping_out
                or request_id in self.swapping_in or bool(self.kv.block_table(request_id))
                or any(s.request_id == request_id for s in self.waiting))

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End a sequence (stop, length or abort) wherever it is. Blocks with I/O in flight are
        released when that I/O completes."""
        if seq.status.is_finished:
            return
        state = seq.status
        seq.status = status
        self._finished_since_step.append(seq.request_id)
        if state in (SequenceStatus.SWAPPING_OUT, SequenceStatus.SWAPPING_IN):
            return  # swap_*_done frees everything
        if state is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif state is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        elif state is SequenceStatus.SWAPPED:
            self.swapped.remove(seq)
            self._free_tier_copy(seq.request_id)
        self.kv.free(seq.request_id)

    @property
    def tier_blocks_used(self) -> int:
        return sum(len(s.tier_blocks) for s in self._stored.values())

    # ---- one step -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(scheduled=[], finished_request_ids=self._finished_since_step)
        self._finished_since_step = []
        self._schedule_decodes(out)
        if not out.preempted_request_ids:
            self._start_swap_ins(out)
            if not self.swapped:
                self._admit_waiting(out, self.limits.max_num_batched_tokens - len(out.scheduled))
        return out

    def _schedule_decodes(self, out: SchedulerOutput) -> None:
        queue = list(self.running)
        kept: list[Sequence] = []
        releasing = sum(len(self.kv.block_table(r)) for r in self.swapping_out)
        promised = 0
        while queue:
            seq = queue.pop(0)
            while self.kv.can_allocate(seq.request_id, seq.num_tokens) is not AllocStatus.OK:
                deficit = self.kv.num_new_blocks(seq.request_id, seq.num_tokens) \
                    - self.kv.num_free_blocks
                if releasing - promised >= deficit:  # blocks are on their way: sit out a step
                    promised += deficit
                    kept.append(seq)
                    break
                victim = queue.pop() if queue else seq
                releasing += self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                self.kv.allocate(seq.request_id, seq.num_tokens)
                out.scheduled.append(self._work(seq))
                kept.append(seq)
        self.running = kept

    def _start_swap_ins(self, out: SchedulerOutput) -> None:
        while self.swapped:
            seq = self.swapped[0]
            busy = bool(self.running or self.swapping_in)
            if self.kv.can_allocate(seq.request_id, seq.num_computed_tokens,
                                    use_watermark=busy) is not AllocStatus.OK:
                break
            self.swapped.pop(0)
            stored = self._stored[seq.request_id]
            gpu_blocks = self.kv.allocate(seq.request_id, seq.num_computed_tokens)
            seq.status = SequenceStatus.SWAPPING_IN
            self.swapping_in[seq.request_id] = seq
            out.swap_in.append(SwapOrder(seq.request_id, stored.owner,
                                         list(zip(stored.tier_blocks, gpu_blocks))))

    def _admit_waiting(self, out: SchedulerOutput, token_budget: int) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_tokens > token_budget:
                break
            if self.kv.can_allocate(seq.request_id, seq.num_tokens,
                                    use_watermark=True) is not AllocStatus.OK:
                break
            self.waiting.popleft()
            self.kv.allocate(seq.request_id, seq.num_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(self._work(seq))
            token_budget -= seq.num_tokens

    def _work(self, seq: Sequence) -> ScheduledSeq:
        start = seq.num_computed_tokens
        return ScheduledSeq(seq.request_id, seq.token_ids(start), start,
                            list(self.kv.block_table(seq.request_id)), seq.sampling_params)

    # ---- preemption -----------------------------------------------------------------------
    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Preempt a running sequence; returns the GPU blocks that a swap-out will release."""
        self.num_preemptions += 1
        seq.num_preemptions += 1
        seq.generation += 1
        out.preempted_request_ids.append(seq.request_id)
        gpu_blocks = list(self.kv.block_table(seq.request_id))
        mode = self.policy.choose(len(gpu_blocks), seq.num_computed_tokens)
        if mode is PreemptionMode.SWAP and self.tier is not None \
                and self.tier.can_reserve(len(gpu_blocks)):
            tier_blocks = self.tier.reserve(len(gpu_blocks))
            owner = (seq.arrival, seq.generation)
            self._stored[seq.request_id] = _Stored(tier_blocks, owner)
            seq.status = SequenceStatus.SWAPPING_OUT
            self.swapping_out[seq.request_id] = seq
            out.swap_out.append(SwapOrder(seq.request_id, owner,
                                          list(zip(gpu_blocks, tier_blocks))))
            return len(gpu_blocks)
        self.kv.free(seq.request_id)
        self._requeue_for_recompute(seq)
        return 0

    def _requeue_for_recompute(self, seq: Sequence) -> None:
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_recomputed_sequences += 1

    def _free_tier_copy(self, request_id: str) -> None:
        stored = self._stored.pop(request_id, None)
        if stored is not None and self.tier is not None:
            self.tier.free(stored.tier_blocks)

    # ---- swap completions (told by the engine) -------------------------------------------
    def swap_out_done(self, request_id: str, ok: bool) -> None:
        seq = self.swapping_out.pop(request_id)
        self.kv.free(request_id)  # the write is over: the GPU copy is no longer needed
        if seq.status.is_finished or not ok:
            self._free_tier_copy(request_id)
            if not seq.status.is_finished:
                self.num_swap_failures += 1
                self._requeue_for_recompute(seq)
            return
        self.swap_out_blocks += len(self._stored[request_id].tier_blocks)
        seq.status = SequenceStatus.SWAPPED
        bisect.insort(self.swapped, seq, key=lambda s: s.arrival)

    def swap_in_done(self, request_id: str, ok: bool) -> None:
        seq = self.swapping_in.pop(request_id)
        stored = self._stored[request_id]
        self._free_tier_copy(request_id)
        if seq.status.is_finished or not ok:
            self.kv.free(request_id)
            if not seq.status.is_finished:
                self.num_swap_failures += 1
                self._requeue_for_recompute(seq)
            return
        self.swap_in_blocks += len(stored.tier_blocks)
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)

    # ---- results --------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: SamplerOutput,
               seqs: dict[str, Sequence]) -> list[Sequence]:
        """Record the sampled token of every scheduled sequence; finish those that stop.
        Returns the sequences that received a token."""
        updated = []
        for work, token_id in zip(out.scheduled, sampled.token_ids):
            seq = seqs[work.request_id]
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens = work.seq_len
            seq.append_token(token_id)
            stop = seq.stop_reason_after_append(self.limits.max_model_len)
            if stop is not None:
                self.finish(seq, stop)
            updated.append(seq)
        return updated
