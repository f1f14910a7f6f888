"""The engine's swap bookkeeping: swap orders out to the tier, outcomes back to the scheduler.

Each step, :meth:`SwapTracker.schedule` collects the swaps that finished (telling the scheduler
and feeding the measured tier bandwidth to the preemption policy), asks the scheduler for the
step, and starts the swaps it ordered. When the step has nothing to run until a swap completes,
it waits for one (counted as stall time) and schedules again. Without a tier it only schedules.
"""
from __future__ import annotations

import logging

from hifc.core.preemption import PreemptionPolicy
from hifc.core.scheduler import Scheduler, SchedulerOutput
from hifc.runtime.swapper import KVSwapper, SwapResult

logger = logging.getLogger(__name__)


class SwapTracker:
    def __init__(self, scheduler: Scheduler, policy: PreemptionPolicy,
                 swapper: KVSwapper | None):
        self.scheduler = scheduler
        self.policy = policy
        self.swapper = swapper

    @property
    def num_pending(self) -> int:
        return self.swapper.num_pending if self.swapper else 0

    def schedule(self) -> SchedulerOutput:
        swapper = self.swapper
        if swapper is None:
            return self.scheduler.schedule()
        self._apply(swapper.collect(block=False))
        out = self.scheduler.schedule()
        self._apply(swapper.submit(out))
        while out.is_empty and swapper.num_pending:
            self._apply(swapper.collect(block=True))
            retry = self.scheduler.schedule()
            # keep the ids of requests that ended since the last step
            retry.finished_request_ids = out.finished_request_ids + retry.finished_request_ids
            out = retry
            self._apply(swapper.submit(out))
        return out

    def drain(self) -> None:
        """Wait for every swap in flight (shutdown) and release what it held."""
        if self.swapper is not None:
            self._apply(self.swapper.drain())

    def _apply(self, results: list[SwapResult]) -> None:
        for r in results:
            if r.ok:
                self.policy.tier_bandwidth.add(r.nbytes, r.seconds)
            else:
                logger.warning("swap failed, the sequence will be recomputed: %s", r.error)
            if r.op == "swap_out":
                self.scheduler.swap_out_done(r.request_id, r.ok)
            else:
                self.scheduler.swap_in_done(r.request_id, r.ok)

    def stats(self) -> dict[str, float | int]:
        s = self.swapper
        return {
            "tier_bytes_written": s.bytes_written if s else 0,
            "tier_bytes_read": s.bytes_read if s else 0,
            "swap_io_seconds": s.io_seconds if s else 0.0,
            "swap_stall_seconds": s.stall_seconds if s else 0.0,
            "swap_out_stall_seconds": s.swap_out_stall_seconds if s else 0.0,
            "swap_jobs_pending": self.num_pending,
        }
