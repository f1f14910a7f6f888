"""Carries the scheduler's I/O orders to the KV tier and reports the finished jobs.

Swap-outs, swap-ins and, with the flash prefix store, prefix reads and writes. Jobs run on the
tier's own threads while the engine keeps stepping; ``collect`` polls them (or, when the engine
has nothing else to run, blocks for the next one), and reports the blocks a swap-out has
staged in the tier's memory before its write ends (the GPU blocks are free from then on).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hifc.core.scheduler import SchedulerOutput
from hifc.tiers.jobs import Job
from hifc.tiers.tier import KVTier

PREFIX_READ = "prefix_read"
PREFIX_WRITE = "prefix_write"
SWAP_OUT_STAGED = "swap_out_staged"  # part of a swap-out left the KV cache; its write goes on
SWAP_OPS = ("swap_out", "swap_in")


@dataclass(frozen=True)
class SwapResult:
    request_id: str  # "" for a prefix write
    op: str  # "swap_out" | "swap_in" | "prefix_read" | "prefix_write"
    ok: bool
    nbytes: int
    seconds: float
    error: str | None
    blocks_ok: int = 0  # prefix read: leading blocks that hold verified K/V
    write_pairs: tuple[tuple[int, bytes], ...] = ()  # prefix write: (GPU block, hash)
    staged: tuple[int, ...] = ()  # swap_out_staged: indices into the order's pairs


@dataclass(frozen=True)
class _Tracked:
    request_id: str
    job: Job
    write_pairs: tuple[tuple[int, bytes], ...] = ()


class KVSwapper:
    """``salt``: the model salt under which prefix records are read and written (None: the
    tier keeps no prefix store)."""

    def __init__(self, tier: KVTier, kv_cache: torch.Tensor, salt: bytes | None = None):
        self.tier = tier
        self.kv_cache = kv_cache
        self.salt = salt
        self._jobs: dict[int, _Tracked] = {}
        self.bytes_written = 0  # swap records
        self.bytes_read = 0
        self.io_seconds = 0.0
        self.stall_seconds = 0.0
        self.swap_out_stall_seconds = 0.0  # the part of stall_seconds spent on a swap-out
        self.prefix_write_wait_seconds = 0.0  # waits with only prefix writes to wait for

    @property
    def num_pending(self) -> int:
        return len(self._jobs)

    def submit(self, out: SchedulerOutput) -> list[SwapResult]:
        """Start the step's I/O: reads before writes, so that a write's reservation never
        overwrites a record the step reads. Jobs that end at once are returned as results."""
        for order in out.swap_out:
            self._track(order.request_id,
                        self.tier.submit_swap_out(self.kv_cache, order.pairs, order.owner))
        for order in out.swap_in:
            self._track(order.request_id,
                        self.tier.submit_swap_in(self.kv_cache, order.pairs, order.owner))
        for read in out.prefix_reads:
            self._track(read.request_id,
                        self.tier.submit_prefix_read(self.kv_cache, read.pairs, self.salt))
        declined = self.write_prefix(out.prefix_writes)
        return declined + self.collect(block=False)

    def write_prefix(self, pairs: list[tuple[int, bytes]]) -> list[SwapResult]:
        """Start storing (GPU block, hash) ``pairs``; returns at once a result for the pairs
        the store declined (already stored, no room, too many writes in flight)."""
        if not pairs:
            return []
        job = self.tier.submit_prefix_write(self.kv_cache, pairs, self.salt)
        covered = set(job.hashes)
        taken = tuple(p for p in pairs if p[1] in covered)
        self._track("", job, taken)
        rest = tuple(p for p in pairs if p[1] not in covered)
        return [SwapResult("", PREFIX_WRITE, False, 0, 0.0, None, write_pairs=rest)] if rest \
            else []

    def _track(self, request_id: str, job: Job, write_pairs=()) -> None:
        self._jobs[job.job_id] = _Tracked(request_id, job, write_pairs)

    def collect(self, block: bool, timeout: float | None = None) -> list[SwapResult]:
        """Swap-outs' newly staged blocks (``SWAP_OUT_STAGED`` results: their GPU blocks are
        free while the write goes on), then finished jobs. With ``block``, when there are
        neither, waits for the next (at most ``timeout`` seconds, inside ``tier.stalled()``: a
        shared device's arbiter serves this engine's I/O first); the wait counts as stall time
        (the engine blocks only when nothing else can run), and as swap-out stall when the
        oldest job is a swap-out: sequences then wait for GPU blocks it has not staged yet, or
        for its write to end, rather than for a swapped sequence to come back. A wait while the
        oldest job is a prefix write is counted apart."""
        finished = self.tier.poll()
        staged = self._take_staged()
        if block and not finished and not staged and self._jobs:
            t0 = time.perf_counter()
            oldest = next(iter(self._jobs.values())).job
            with self.tier.stalled():
                self.tier.wait_progress(timeout)
            finished = self.tier.poll()
            staged = self._take_staged()
            waited = time.perf_counter() - t0
            if oldest.op == PREFIX_WRITE:
                self.prefix_write_wait_seconds += waited
            else:
                self.stall_seconds += waited
            if oldest.op == "swap_out":
                self.swap_out_stall_seconds += waited
        return staged + [self._result(job) for job in finished if job.job_id in self._jobs]

    def _take_staged(self) -> list[SwapResult]:
        """The blocks that swap-outs still writing have copied out of the KV cache since the
        last call, one result per job."""
        results = []
        for tracked in self._jobs.values():
            if tracked.job.op == "swap_out" and (staged := self.tier.take_staged(tracked.job)):
                results.append(SwapResult(tracked.request_id, SWAP_OUT_STAGED, True, 0, 0.0,
                                          None, staged=tuple(staged)))
        return results

    def collect_closed(self) -> list[SwapResult]:
        """After the tier closed (every job has ended): the results not collected yet."""
        return [self._result(t.job) for t in list(self._jobs.values()) if t.job.done]

    def _result(self, job: Job) -> SwapResult:
        tracked = self._jobs.pop(job.job_id)
        seconds = job.latency_s or 0.0
        if job.op in SWAP_OPS:
            self.io_seconds += seconds
        if job.ok and job.op == "swap_out":
            self.bytes_written += job.nbytes
        elif job.ok and job.op == "swap_in":
            self.bytes_read += job.nbytes
        return SwapResult(tracked.request_id, job.op, job.ok, job.nbytes, seconds, job.error,
                          blocks_ok=getattr(job, "blocks_ok", 0),
                          write_pairs=tracked.write_pairs)

    def drain(self) -> list[SwapResult]:
        """Wait for every job in flight (shutdown)."""
        results = []
        while self._jobs:
            results += self.collect(block=True)
        return results
