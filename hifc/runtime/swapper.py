"""Carries the scheduler's swap orders to the KV tier and reports finished swaps.

Jobs run on the tier's own threads while the engine keeps stepping; ``collect`` polls them
(or, when the engine has nothing else to run, blocks for the next one).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hifc.core.scheduler import SchedulerOutput
from hifc.tiers.jobs import Job
from hifc.tiers.tier import KVTier


@dataclass(frozen=True)
class SwapResult:
    request_id: str
    op: str  # "swap_out" | "swap_in"
    ok: bool
    nbytes: int
    seconds: float
    error: str | None


class KVSwapper:
    def __init__(self, tier: KVTier, kv_cache: torch.Tensor):
        self.tier = tier
        self.kv_cache = kv_cache
        self._jobs: dict[int, tuple[str, Job]] = {}
        self.bytes_written = 0
        self.bytes_read = 0
        self.io_seconds = 0.0
        self.stall_seconds = 0.0
        self.swap_out_stall_seconds = 0.0  # the part of stall_seconds spent on a swap-out
        self.errors: list[str] = []

    @property
    def num_pending(self) -> int:
        return len(self._jobs)

    def submit(self, out: SchedulerOutput) -> list[SwapResult]:
        """Start the step's swaps. Jobs that fail at once are returned as results."""
        for order in out.swap_out:
            self._track(order.request_id,
                        self.tier.submit_swap_out(self.kv_cache, order.pairs, order.owner))
        for order in out.swap_in:
            self._track(order.request_id,
                        self.tier.submit_swap_in(self.kv_cache, order.pairs, order.owner))
        return self.collect(block=False)

    def _track(self, request_id: str, job: Job) -> None:
        self._jobs[job.job_id] = (request_id, job)

    def collect(self, block: bool) -> list[SwapResult]:
        """Finished swaps. With ``block``, waits for the oldest job if none has finished (inside
        ``tier.stalled()``: a shared device's arbiter serves this engine's I/O first); the
        wait counts as stall time (the engine blocks only when nothing else can run), and as
        swap-out stall when that job is a swap-out: sequences then wait for the GPU blocks its
        write still holds, rather than for a swapped sequence to come back."""
        finished = self.tier.poll()
        if block and not finished and self._jobs:
            t0 = time.perf_counter()
            oldest = next(iter(self._jobs.values()))[1]
            with self.tier.stalled():
                finished = [self.tier.wait(oldest)] + self.tier.poll()
            waited = time.perf_counter() - t0
            self.stall_seconds += waited
            if oldest.op == "swap_out":
                self.swap_out_stall_seconds += waited
        return [self._result(job) for job in finished if job.job_id in self._jobs]

    def _result(self, job: Job) -> SwapResult:
        request_id, _ = self._jobs.pop(job.job_id)
        seconds = job.latency_s or 0.0
        self.io_seconds += seconds
        if job.ok:
            if job.op == "swap_out":
                self.bytes_written += job.nbytes
            else:
                self.bytes_read += job.nbytes
        else:
            self.errors.append(f"{job.op} of {request_id}: {job.error}")
        return SwapResult(request_id, job.op, job.ok, job.nbytes, seconds, job.error)

    def drain(self) -> list[SwapResult]:
        """Wait for every job in flight (shutdown)."""
        results = []
        while self._jobs:
            results += self.collect(block=True)
        return results
