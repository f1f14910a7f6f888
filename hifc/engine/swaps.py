"""The engine's tier bookkeeping: I/O orders out to the tier, outcomes back to the scheduler.

Each step, :meth:`SwapTracker.schedule` collects the jobs that finished and the blocks that
swap-outs have staged (telling the scheduler, which frees staged GPU blocks at once, and feeding
the measured tier bandwidth to the preemption policy and the read bandwidth to the prefix cost
rule), asks the scheduler for the step, and starts the I/O it ordered: swaps, and with the
flash prefix store, prefix reads and writes. When the step has nothing to run until a job
completes or stages blocks, it waits for that (counted as stall time) and schedules again.
Without a tier it only schedules. :meth:`flush` writes, at a clean shutdown, the cached GPU
blocks the prefix store lacks, for a bounded time.
"""
from __future__ import annotations

import logging
import time

from hifc.core.preemption import PreemptionPolicy, RateMeter
from hifc.core.scheduler import Scheduler, SchedulerOutput
from hifc.runtime.swapper import (
    PREFIX_READ, PREFIX_WRITE, SWAP_OUT_STAGED, KVSwapper, SwapResult,
)

logger = logging.getLogger(__name__)


class TierPrefixStore:
    """The flash tier's prefix store under one model salt (the scheduler's view of it)."""

    def __init__(self, tier, salt: bytes):
        self.tier = tier
        self.salt = salt

    def num_stored(self, hashes: list[bytes]) -> int:
        return self.tier.lookup_prefix(hashes, self.salt, count=False)

    def hold(self, hashes: list[bytes]) -> list[int]:
        return self.tier.hold_prefix(hashes, self.salt)

    def release(self, tier_blocks: list[int]) -> None:
        self.tier.release_prefix(tier_blocks)


class SwapTracker:
    def __init__(self, scheduler: Scheduler, policy: PreemptionPolicy,
                 swapper: KVSwapper | None, read_bandwidth: RateMeter | None = None):
        self.scheduler = scheduler
        self.policy = policy
        self.swapper = swapper
        self.read_bandwidth = read_bandwidth  # tier reads (swap-ins, prefix reads), bytes/s
        self.flush_seconds = 0.0  # the last flush
        self.flush_blocks = 0

    @property
    def num_pending(self) -> int:
        return self.swapper.num_pending if self.swapper else 0

    def schedule(self, wait: bool = True) -> SchedulerOutput:
        """The step's schedule, its I/O started. ``wait=False``: return an empty step rather
        than wait for I/O (a step in flight may free what is missing)."""
        swapper = self.swapper
        if swapper is None:
            return self.scheduler.schedule()
        self._apply(swapper.collect(block=False))
        out = self.scheduler.schedule()
        self._apply(swapper.submit(out))
        while wait and out.is_empty and swapper.num_pending:
            queues, t0 = self._queues(), time.perf_counter()
            self._apply(swapper.collect(block=True))
            logger.debug("nothing to run for %.3f s, waiting on swap I/O with %s",
                         time.perf_counter() - t0, queues)
            retry = self.scheduler.schedule()
            # keep the ids of requests that ended since the last step
            retry.finished_request_ids = out.finished_request_ids + retry.finished_request_ids
            out = retry
            self._apply(swapper.submit(out))
        return out

    def _queues(self) -> str:
        sched = self.scheduler
        return (f"{len(sched.running)} running, {len(sched.waiting)} waiting, "
                f"{len(sched.swapping_out)} swapping out, {len(sched.swapped)} swapped, "
                f"{len(sched.swapping_in)} swapping in")

    def drain(self) -> None:
        """Wait for every job in flight (shutdown) and release what it held."""
        if self.swapper is not None:
            self._apply(self.swapper.drain())

    def flush(self, seconds: float) -> int:
        """Write the cached GPU blocks that the prefix store lacks, for at most ``seconds``
        (then what has not started is cancelled when the tier closes). Call with no request
        left, before closing the tier; returns the blocks written."""
        store, swapper = self.scheduler.store, self.swapper
        if store is None or swapper is None or seconds <= 0:
            return 0
        start = time.perf_counter()
        deadline = start + seconds
        written = 0
        while time.perf_counter() < deadline:
            todo = store.flush_candidates()
            if todo:
                declined = swapper.write_prefix(store.begin_flush(todo))
                self._apply(declined)
                if declined and len(declined[0].write_pairs) == len(todo) \
                        and not swapper.num_pending:
                    break  # the store takes none of them (no room)
            elif not swapper.num_pending:
                break
            results = swapper.collect(block=True, timeout=max(0.0, deadline - time.perf_counter()))
            written += sum(len(r.write_pairs) for r in results if r.op == PREFIX_WRITE and r.ok)
            self._apply(results)
        self.flush_seconds = time.perf_counter() - start
        self.flush_blocks = written
        return written

    def after_close(self) -> None:
        """The tier closed: report the jobs it ended (cancelled prefix writes among them)."""
        if self.swapper is not None:
            self._apply(self.swapper.collect_closed())

    def _apply(self, results: list[SwapResult]) -> None:
        for r in results:
            if r.op == SWAP_OUT_STAGED:
                self.scheduler.swap_out_staged(r.request_id, list(r.staged))
                continue
            if r.op == PREFIX_WRITE:
                self.scheduler.prefix_write_done(list(r.write_pairs), r.ok)
                continue
            if r.ok:
                if r.op != PREFIX_READ:
                    self.policy.tier_bandwidth.add(r.nbytes, r.seconds)
                if r.op != "swap_out" and self.read_bandwidth is not None:
                    self.read_bandwidth.add(r.nbytes, r.seconds)
            else:
                logger.warning("%s of %s failed, recomputing from the first bad block: %s",
                               r.op, r.request_id, r.error)
            if r.op == "swap_out":
                self.scheduler.swap_out_done(r.request_id, r.ok)
            elif r.op == "swap_in":
                self.scheduler.swap_in_done(r.request_id, r.ok)
            else:
                self.scheduler.prefix_read_done(r.request_id, r.blocks_ok)

    def stats(self) -> dict[str, float | int]:
        s = self.swapper
        return {
            "tier_bytes_written": s.bytes_written if s else 0,
            "tier_bytes_read": s.bytes_read if s else 0,
            "swap_io_seconds": s.io_seconds if s else 0.0,
            "swap_stall_seconds": s.stall_seconds if s else 0.0,
            "swap_out_stall_seconds": s.swap_out_stall_seconds if s else 0.0,
            "swap_out_blocks_freed_staged": self.scheduler.swap_out_blocks_freed_staged,
            "prefix_write_wait_seconds": s.prefix_write_wait_seconds if s else 0.0,
            "swap_jobs_pending": self.num_pending,
            "prefix_store_flush_seconds": self.flush_seconds,
            "prefix_store_flush_blocks": self.flush_blocks,
        }
