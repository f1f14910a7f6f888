"""Continuous batching: every step decodes the running sequences and admits waiting prompts.

Policy (vLLM-style, no chunked prefill):
1. Each running sequence gets one decode token, in admission order. When the pool has no block
   for it, the newest running sequence is preempted (possibly the one being scheduled) until it
   fits. Preempted sequences go back to the front of the waiting queue.
2. If nothing was preempted in this step, waiting sequences are admitted in order while the
   sequence and token budgets and the free blocks (above a small watermark) allow. A prompt is
   prefilled in one step; a preempted sequence is re-prefilled over prompt + generated tokens.

The scheduler speaks to the model runner only through ``SchedulerOutput``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hifc.core.kv_manager import AllocStatus, KVCacheManager
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.sampling_params import SamplingParams


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


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # ended since the last step

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv_manager: KVCacheManager):
        self.limits = limits
        self.kv = kv_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._finished_since_step: list[str] = []
        self.num_preemptions = 0
        self.num_recomputed_sequences = 0

    # ---- requests -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        need = self.kv.can_allocate(seq.request_id, seq.num_prompt_tokens + 1)
        if need is AllocStatus.NEVER:
            raise ValueError(f"prompt of {seq.num_prompt_tokens} tokens needs more KV blocks than "
                             f"the pool holds ({self.kv.num_total_blocks})")
        self.waiting.append(seq)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End a sequence (stop, length or abort) wherever it is, and free its blocks."""
        if seq.status.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq.request_id)
        seq.status = status
        self._finished_since_step.append(seq.request_id)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- one step -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(scheduled=[], finished_request_ids=self._finished_since_step)
        self._finished_since_step = []
        token_budget = self.limits.max_num_batched_tokens
        self._schedule_decodes(out)
        token_budget -= len(out.scheduled)
        if not out.preempted_request_ids:
            self._admit_waiting(out, token_budget)
        return out

    def _schedule_decodes(self, out: SchedulerOutput) -> None:
        queue = list(self.running)
        kept: list[Sequence] = []
        while queue:
            seq = queue.pop(0)
            while self.kv.can_allocate(seq.request_id, seq.num_tokens) is not AllocStatus.OK:
                victim = queue.pop() if queue else seq
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                self.kv.allocate(seq.request_id, seq.num_tokens)
                out.scheduled.append(self._work(seq))
                kept.append(seq)
        self.running = kept

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

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Preempt by recompute: drop the KV, requeue at the front of the waiting queue."""
        self.kv.free(seq.request_id)
        seq.num_computed_tokens = 0
        seq.generation += 1
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.num_recomputed_sequences += 1
        out.preempted_request_ids.append(seq.request_id)

    # ---- results --------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: list[int],
               seqs: dict[str, Sequence]) -> list[Sequence]:
        """Record the sampled token of every scheduled sequence; finish those that stop.
        Returns the sequences that received a token."""
        updated = []
        for work, token_id in zip(out.scheduled, sampled):
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
