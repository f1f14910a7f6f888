"""Shared setup of the core tests: a scheduler over a KV manager and a fake tier, no model."""
from __future__ import annotations

from hifc.core.kv_manager import KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.preemption import PreemptionPolicy
from hifc.core.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from hifc.core.sequence import Sequence
from hifc.sampling_params import SamplingParams

SALT = bytes(range(32))


class FakeTier:
    """The block space of a swap tier, torch-free (what the scheduler sees of one)."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks))

    def can_reserve(self, n):
        return n <= len(self.free_ids)

    def reserve(self, n):
        ids, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        return ids

    def free(self, ids):
        self.free_ids.extend(ids)


def make_scheduler(num_blocks=8, block_size=16, max_num_seqs=8, max_len=128, mode="recompute",
                   tier=None, budget=None, prefix_caching=False, chunked=True, on_evict=None,
                   long_prefill=0, attention_budget=0):
    """A scheduler and its KV manager (watermark 0). ``budget``: max_num_batched_tokens
    (default max(max_len, max_num_seqs))."""
    kv = KVCacheManager(num_blocks, block_size, watermark=0.0,
                        salt=SALT if prefix_caching else None, on_evict=on_evict)
    limits = SchedulerLimits(max_num_seqs, budget or max(max_len, max_num_seqs), max_len,
                             chunked, long_prefill, attention_budget)
    return Scheduler(limits, kv, PreemptionPolicy(mode, block_bytes=4096), tier), kv


def make_seq(rid, n_prompt, max_tokens=100, arrival=0, tokens=None):
    """A greedy sequence; its prompt is ``tokens`` or 1..n_prompt. Token 0 is its EOS."""
    prompt = list(tokens) if tokens is not None else list(range(1, n_prompt + 1))
    return Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0),
                    frozenset({0}), arrival)


def run_step(sched, seqs, token=5) -> SchedulerOutput:
    """Schedule a step and feed ``token`` to every sequence that samples in it."""
    out = sched.schedule()
    sched.update(out, SamplerOutput([token] * len(out.sampling)), seqs)
    return out


def block_references(kv, seq_ids) -> dict[int, int]:
    """block id -> how many of these sequences' tables hold it."""
    refs: dict[int, int] = {}
    for rid in seq_ids:
        for block in kv.block_table(rid):
            if block >= 0:
                refs[block] = refs.get(block, 0) + 1
    return refs
