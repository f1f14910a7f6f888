"""Continuous batching with chunked prefill and a GPU prefix cache (vLLM V1 style).

Each sequence records ``num_computed_tokens``: the tokens whose K/V is in the cache. A step
computes some more tokens of some sequences, within a budget of ``max_num_batched_tokens``;
a sequence samples its next token only in the step that computes its last known token.

1. Running sequences: decodes first (one token each), then the prompts being prefilled, in
   admission order, each with a chunk of what is left of the budget (the whole rest of the
   prompt without chunked prefill, or nothing this step if it does not fit; with
   ``long_prefill_token_threshold``, no chunk longer than that; with
   ``prefill_attention_budget``, a step's prompt chunks attend over at most that many
   query-key pairs in all, so chunks shrink as a long prompt advances). When the pool has
   no block for a sequence, the newest running sequence not yet scheduled in this step is
   preempted until it fits. The sequence sits out the step instead when a swap-out in flight
   will release enough blocks, or when it is itself the newest and is prefilling (it keeps
   what it has computed; a decode that needs blocks later preempts it). A decode that is the
   newest preempts itself.
2. If nothing was preempted and no sequence sat out for blocks in this step, swapped sequences
   are swapped back in (oldest first) while free blocks stay above a watermark: the read starts
   at once and overlaps the following steps; the sequence runs again once it has completed.
3. Only when no sequence is left swapped, waiting sequences are admitted in order while the
   sequence and token budgets and the free blocks (above the watermark) allow. A sequence
   starts from the longest prefix of its tokens that the prefix cache holds (at least its last
   token is computed), then prefills the rest in chunks; a recomputed sequence re-prefills
   prompt + generated tokens the same way, and finds its own earlier blocks if they are still
   cached. Blocks are cached as soon as they are scheduled, so a prompt admitted in the same
   step shares the blocks another one computes in it (each layer writes the step's K/V before
   any query attends).

Preemption and swapping: :mod:`hifc.core.swapping`.

The flash prefix store as a second level (``store``, :mod:`hifc.core.store_level`). At
admission, the blocks after the GPU hit are looked up in the store and the cost rule says how
many to read; a sequence with blocks to read takes GPU blocks for them and waits, LOADING (like
a swap-in, while the others run), then prefills the rest; a read that fails part-way leaves the
sequence to recompute from its first bad block. A waiting sequence whose next block another
sequence is reading waits for that read (then finds the block in the GPU cache). Each step the
store level names blocks to write (``SchedulerOutput.prefix_writes``), holding a reference on
each until its write ends.

Scheduling ahead (asynchronous scheduling). Scheduling a step advances each scheduled
sequence's ``num_computed_tokens`` at once and counts the token it samples as pending
(``Sequence.num_pending_tokens``) until ``update`` applies it, so the engine may schedule step
N+1 while step N runs: a sequence whose token from step N is pending decodes it in step N+1 as
``PENDING_TOKEN`` (the runner reads it on the device). Such a sequence may turn out to have
stopped at step N; the token it samples in step N+1 is then dropped. Sequences whose pending
tokens reach their length limit are not scheduled again. A sequence preempted while its token is
pending keeps it (``update``); the engine applies step N before it schedules step N+2, so the
token is there before the sequence can be admitted or swapped in again.

The scheduler speaks to the runtime only through ``SchedulerOutput`` and learns of finished
I/O through ``swap_out_done`` / ``swap_in_done`` / ``prefix_read_done`` /
``prefix_write_done``, called by the engine.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from dataclasses import dataclass

from hifc.core.kv_manager import AllocStatus, KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.preemption import PreemptionPolicy
from hifc.core.scheduler_output import (  # noqa: F401  (the scheduler's public types)
    PENDING_TOKEN, PrefixRead, ScheduledSeq, SchedulerLimits, SchedulerOutput, SwapOrder,
    TierBlocks,
)
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.core.store_level import StoreLevel
from hifc.core.swapping import SwapMixin, TierCopy


@dataclass(frozen=True)
class _Load:
    """A sequence LOADING: ``hashes`` are read into the blocks after its ``num_gpu`` hit."""

    num_gpu: int
    hashes: list[bytes]


def attention_pairs(context: int, num_new: int) -> int:
    """Query-key pairs a chunk of ``num_new`` tokens after ``context`` computed ones attends
    over (causal: token i sees the context and tokens 0..i of the chunk)."""
    return num_new * context + num_new * (num_new + 1) // 2


def longest_chunk_within(context: int, pairs: int) -> int:
    """The most tokens after ``context`` computed ones whose chunk attends over at most
    ``pairs`` query-key pairs: the largest n with n^2 + (2 context + 1) n <= 2 pairs."""
    b = 2 * context + 1
    return max(0, (math.isqrt(b * b + 8 * pairs) - b) // 2)


@dataclass
class _StepBudget:
    """What is left of a step's budgets: tokens, and query-key pairs for prompt chunks (None:
    no such limit)."""

    tokens: int
    pairs: int | None

    def take(self, context: int, num_new: int, num_to_compute: int) -> None:
        self.tokens -= num_new
        if self.pairs is not None and num_to_compute > 1:
            self.pairs -= attention_pairs(context, num_new)


class Scheduler(SwapMixin):
    def __init__(self, limits: SchedulerLimits, kv_manager: KVCacheManager,
                 policy: PreemptionPolicy, tier: TierBlocks | None = None,
                 store: StoreLevel | None = None):
        if store is not None and not kv_manager.prefix_caching:
            raise ValueError("the flash prefix store needs prefix caching (a model salt)")
        self.limits = limits
        self.kv = kv_manager
        self.policy = policy
        self.tier = tier
        self.store = store
        self.loading: dict[str, Sequence] = {}
        self._loads: dict[str, _Load] = {}
        self._loading_hashes: Counter[bytes] = Counter()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapping_out: dict[str, Sequence] = {}
        self.swapped: list[Sequence] = []  # ordered by arrival
        self.swapping_in: dict[str, Sequence] = {}
        self._stored: dict[str, TierCopy] = {}  # tier copy of swapped(-ing) sequences
        self._finished_since_step: list[str] = []
        self.num_preemptions = 0
        self.num_recomputed_sequences = 0
        self.num_swap_failures = 0
        self.swap_out_blocks = 0
        self.swap_out_blocks_freed_staged = 0  # GPU blocks freed before their write ended
        self.swap_in_blocks = 0
        self.prefix_cache_queries = 0  # tokens of the sequences admitted with prefix caching on
        self.prefix_cache_hits = 0  # of them, tokens found in the GPU prefix cache

    # ---- requests -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if self.kv.can_allocate(seq.request_id, seq.num_prompt_tokens + 1) is AllocStatus.NEVER:
            raise ValueError(f"prompt of {seq.num_prompt_tokens} tokens needs more KV blocks than "
                             f"the pool holds ({self.kv.num_total_blocks})")
        self.waiting.append(seq)

    def is_tracking(self, request_id: str) -> bool:
        """True while any state (queue entry, blocks, I/O in flight) refers to the request."""
        return (request_id in self._stored or request_id in self.swapping_out
                or request_id in self.swapping_in or request_id in self.loading
                or bool(self.kv.block_table(request_id))
                or any(s.request_id == request_id for s in self.waiting))

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End a sequence (stop, length or abort) wherever it is. Blocks with I/O in flight are
        released when that I/O completes."""
        if seq.status.is_finished:
            return
        state = seq.status
        seq.status = status
        self._finished_since_step.append(seq.request_id)
        if state in (SequenceStatus.SWAPPING_OUT, SequenceStatus.SWAPPING_IN,
                     SequenceStatus.LOADING):
            return  # swap_*_done / prefix_read_done frees everything
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
        if self.store is not None:  # before this step's allocations may evict them
            out.prefix_writes = self.store.select_writes()
        budget = _StepBudget(self.limits.max_num_batched_tokens,
                             self.limits.prefill_attention_budget or None)
        starved = self._schedule_running(out, budget)
        if not (out.preempted_request_ids or starved):
            self._start_swap_ins(out)
            # No new request takes blocks freed by a swap-out before its sequence is back,
            # unless the step would otherwise run nothing: then the swapped sequences wait for
            # their writes to end (a slow disk), and the GPU would idle meanwhile.
            idle = not (self.running or self.swapping_in or self.loading)
            if idle or not (self.swapped or self.swapping_out):
                self._admit_waiting(out, budget)
        return out

    def _chunk(self, context: int, num_to_compute: int, budget: _StepBudget) -> int:
        """Tokens to compute in this step out of ``num_to_compute`` after ``context`` computed
        ones (0: none this step)."""
        if num_to_compute == 1:  # a decode (most calls): its token, whatever the limits
            return 1 if budget.tokens > 0 else 0
        if not self.limits.chunked_prefill:
            return num_to_compute if num_to_compute <= budget.tokens else 0
        num_new = min(num_to_compute, budget.tokens)
        if self.limits.long_prefill_token_threshold > 0:
            num_new = min(num_new, self.limits.long_prefill_token_threshold)
        if budget.pairs is not None:
            num_new = min(num_new, longest_chunk_within(context, budget.pairs))
        return num_new

    def _schedule_running(self, out: SchedulerOutput, budget: _StepBudget) -> bool:
        """Schedule the running sequences (decodes first), taking from ``budget``. Returns
        whether a sequence sat out the step for lack of blocks."""
        max_len = self.limits.max_model_len
        # those that stay running: the scheduled, those left out of this step, and those
        # ending by length (they finish when their pending tokens arrive)
        kept: set[str] = set()
        decodes, prompts = [], []
        for s in self.running:
            if s.ends_by_length_with_pending(max_len):
                kept.add(s.request_id)
            else:
                (decodes if s.num_tokens_to_compute == 1 else prompts).append(s)
        queue = deque(decodes + prompts)
        releasing = self._num_releasing()
        releasing += self.store.num_releasing if self.store is not None else 0
        promised = 0
        starved = False
        while queue:
            seq = queue.popleft()
            to_compute = seq.num_tokens_to_compute
            num_new = self._chunk(seq.num_computed_tokens, to_compute, budget)
            if num_new == 0:  # no budget left this step
                kept.add(seq.request_id)
                continue
            target = seq.num_computed_tokens + num_new
            holds = self.kv.holds(seq.request_id, target)  # most decodes: nothing to allocate
            while not holds and self.kv.can_allocate(seq.request_id, target) is not AllocStatus.OK:
                deficit = self.kv.num_new_blocks(seq.request_id, target) - self.kv.num_free_blocks
                victim = max([*queue, seq], key=lambda s: s.arrival)
                on_their_way = releasing - promised >= deficit
                if on_their_way or (victim is seq and to_compute > 1):
                    promised += deficit if on_their_way else 0
                    starved = True
                    kept.add(seq.request_id)
                    break
                if victim is not seq:
                    queue.remove(victim)
                releasing += self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                if holds:
                    self.kv.cache_blocks(seq, target)
                else:
                    self._allocate(seq, target)
                budget.take(seq.num_computed_tokens, num_new, to_compute)
                out.scheduled.append(self._schedule_work(seq, num_new))
                kept.add(seq.request_id)
        self.running = [s for s in self.running if s.request_id in kept]
        return starved

    def _admit_waiting(self, out: SchedulerOutput, budget: _StepBudget) -> None:
        block_size = self.kv.block_size
        while (self.waiting and budget.tokens > 0
               and len(self.running) + len(self.loading) < self.limits.max_num_seqs):
            seq = self.waiting[0]
            prefix = self.kv.cached_prefix(seq)
            plan = self._plan_store_read(seq, len(prefix))
            if plan is None:
                break  # its next block is being read for another sequence: wait for it
            hashes, num_found, num_read = plan
            if num_read:
                if not self._start_load(seq, prefix, hashes[:num_read], out):
                    break
            else:
                num_cached = len(prefix) * block_size
                num_new = self._chunk(num_cached, seq.num_tokens - num_cached, budget)
                if num_new == 0:
                    break
                reserve = self._readmit_reserve(seq, num_cached + num_new)
                if self.kv.can_allocate(seq.request_id, num_cached + num_new, use_watermark=True,
                                        prefix=prefix, reserve=reserve) is not AllocStatus.OK:
                    break
                self.waiting.popleft()
                self._allocate(seq, num_cached + num_new, prefix)
                seq.num_computed_tokens = num_cached
                if seq.num_cached_tokens is None:
                    seq.num_cached_tokens = num_cached
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                budget.take(num_cached, num_new, seq.num_tokens - num_cached)
                out.scheduled.append(self._schedule_work(seq, num_new))
            if self.kv.prefix_caching:
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += len(prefix) * block_size
            if self.store is not None:
                self.store.count_admission(len(hashes), num_found, num_read)

    def _plan_store_read(self, seq: Sequence,
                         num_gpu: int) -> tuple[list[bytes], int, int] | None:
        """(hashes after the GPU hit, how many the store holds, how many to read); None when
        the first of them is being read for another sequence."""
        if self.store is None or not self.kv.reuses_prefix(seq):
            return [], 0, 0
        max_blocks = (seq.num_tokens - 1) // self.kv.block_size
        hashes = self.kv.block_hashes(seq)[num_gpu:max_blocks]
        if hashes and self._loading_hashes[hashes[0]]:
            return None
        return (hashes, *self.store.plan_read(hashes))

    def _start_load(self, seq: Sequence, prefix: list[int], hashes: list[bytes],
                    out: SchedulerOutput) -> bool:
        """Give the sequence its GPU hit and blocks for ``hashes``, and order their read."""
        rid = seq.request_id
        num_tokens = (len(prefix) + len(hashes)) * self.kv.block_size
        if self.kv.can_allocate(rid, num_tokens, use_watermark=True, prefix=prefix,
                                reserve=self._readmit_reserve(seq, num_tokens)) \
                is not AllocStatus.OK:
            return False
        self.waiting.popleft()
        new_blocks = self.kv.allocate(rid, num_tokens, prefix)  # cached once read
        seq.status = SequenceStatus.LOADING
        self.loading[rid] = seq
        self._loads[rid] = _Load(len(prefix), hashes)
        self._loading_hashes.update(hashes)
        out.prefix_reads.append(PrefixRead(rid, list(zip(hashes, new_blocks))))
        return True

    def _readmit_reserve(self, seq: Sequence, num_tokens: int) -> int:
        """The growth reserve (``_resume_reserve``) of a preempted sequence readmitted to
        recompute, given blocks for ``num_tokens`` tokens now; none for a new sequence or
        when nothing else runs."""
        if not seq.num_preemptions or not self._busy():
            return 0
        return self._resume_reserve(seq, self.kv.num_blocks_for(num_tokens))

    def _allocate(self, seq: Sequence, num_tokens: int, prefix: list[int] = ()) -> None:
        """Give the sequence blocks for ``num_tokens`` tokens, which this step computes, and
        cache its full blocks among them at once: a sequence admitted later in the same step may
        share them, as every layer writes the step's K/V before any query attends."""
        self.kv.allocate(seq.request_id, num_tokens, prefix)
        self.kv.cache_blocks(seq, num_tokens)

    def _schedule_work(self, seq: Sequence, num_new: int) -> ScheduledSeq:
        """The sequence's work in this step: its next ``num_new`` tokens (the pending one as
        ``PENDING_TOKEN``). Counts them as computed, and the token it samples as pending."""
        start, num_tokens = seq.num_computed_tokens, seq.num_tokens
        end = start + num_new
        if num_new == 1 and start >= num_tokens - 1:  # a decode (most rows): the last token
            token_ids = [seq.token_ids(start, end)[0] if end == num_tokens else PENDING_TOKEN]
        else:
            known_end = min(end, num_tokens)
            token_ids = seq.token_ids(start, known_end) if start < known_end else []
            token_ids += [PENDING_TOKEN] * (end - max(start, known_end))
        samples = end == num_tokens + seq.num_pending_tokens
        seq.num_computed_tokens = end
        seq.num_pending_tokens += samples
        return ScheduledSeq(seq.request_id, token_ids, start, self.kv.block_table(seq.request_id),
                            seq.sampling_params, samples=samples)

    def prefix_read_done(self, request_id: str, blocks_ok: int) -> None:
        """A prefix read ended: its first ``blocks_ok`` blocks hold verified K/V."""
        if request_id in self.swapping_in:
            stored = self._stored[request_id]
            if self.store is not None:
                self.store.count_read(stored.num_read, blocks_ok)
            self._swap_in_part_done(request_id, blocks_ok == stored.num_read)
            return
        seq = self.loading.pop(request_id)
        load = self._loads.pop(request_id)
        self._loading_hashes.subtract(load.hashes)
        self._loading_hashes = +self._loading_hashes  # drop zero counts
        self.store.count_read(len(load.hashes), blocks_ok)
        if seq.status.is_finished:
            self.kv.free(request_id)
            return
        num_cached = (load.num_gpu + blocks_ok) * self.kv.block_size
        seq.num_computed_tokens = num_cached
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = num_cached
        self.kv.cache_blocks(seq, num_cached)  # the blocks read are shareable now
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)

    def prefix_write_done(self, pairs: list[tuple[int, bytes]], written: bool) -> None:
        """A prefix write of (GPU block, hash) ``pairs`` ended (or the store declined them)."""
        self.store.write_done(pairs, written)

    # ---- results --------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: SamplerOutput,
               seqs: dict[str, Sequence]) -> list[Sequence]:
        """Apply a step's results (``seqs``: the scheduled sequences by id, as they were
        scheduled): append the sampled token of those that sampled and finish those that stop.
        A sequence that finished since (aborted, or stopped at the step before under
        asynchronous scheduling) drops its token; one preempted since keeps it. The blocks the
        step completed are cached (and offered to the prefix store) for those still running.
        Returns the sequences that received a token."""
        sampling = out.sampling
        if len(sampled) != len(sampling):
            raise RuntimeError(f"{len(sampled)} sampled tokens for {len(sampling)} sequences "
                               "that sample in this step")
        tokens = iter(sampled.token_ids)
        updated = []
        # looked up once: the loop runs for every scheduled sequence
        running, cache_blocks, store = SequenceStatus.RUNNING, self.kv.cache_blocks, self.store
        max_len = self.limits.max_model_len
        for work in out.scheduled:
            token_id = next(tokens) if work.samples else None
            seq = seqs[work.request_id]
            if token_id is not None:
                seq.num_pending_tokens -= 1
            if seq.status.is_finished:
                continue
            if token_id is not None:
                seq.append_token(token_id)
            if seq.status is running:
                cache_blocks(seq, work.seq_len)  # its last block's tokens are known now
                if store is not None:
                    self._note_computed(seq, work)
            if token_id is None:
                continue  # a prompt chunk before the last
            stop = seq.stop_reason_after_append(max_len)
            if stop is not None:
                self.finish(seq, stop)
            updated.append(seq)
        return updated

    def _note_computed(self, seq: Sequence, work: ScheduledSeq) -> None:
        """Tell the store level which full blocks this step completed (cached ones only)."""
        size = self.kv.block_size
        first, end = work.start_pos // size, min(work.seq_len // size, len(seq.block_hashes))
        if first >= end:
            return
        table, pool = self.kv.block_table(seq.request_id), self.kv.pool
        self.store.note_computed([(table[p], seq.block_hashes[p]) for p in range(first, end)
                                  if pool.block_hash(table[p]) == seq.block_hashes[p]])
