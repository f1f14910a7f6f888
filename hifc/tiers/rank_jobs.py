"""``RankJobs``: a tensor-parallel worker rank's side of the tier jobs.

The engine's tier (rank 0) decides every job and sends each rank its ``IOOrder``; here a worker
rank starts the order on its own mover over its own KV shard, and reports how each job ended
(``RankOutcome``) when asked. A job's outcome on the engine's side is the combination of every
rank's (:meth:`hifc.tiers.tier.KVTier.poll`): it is done when all ranks are, and failed if any
failed, so a failure on one rank turns the swap into a recompute as one failure does alone.
"""
from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass, field

import torch

from hifc.tiers.jobs import IOOrder, RankOutcome, classify
from hifc.tiers.mover import SWAP_IN, SWAP_OUT, TierMover
from hifc.tiers.tier import copy_view, ready_event


@dataclass
class _Running:
    order: IOOrder
    futures: list[cf.Future]
    done: bytearray = field(default_factory=bytearray)  # prefix jobs, per pair
    error: tuple | None = None  # a failure to start


class RankJobs:
    def __init__(self, rank: int, mover: TierMover, kv_cache: torch.Tensor):
        self.rank = rank
        self.mover = mover
        self.kv_cache = kv_cache  # this rank's [L, 2, N, bs, Hkv / tp, D]
        self._running: dict[int, _Running] = {}

    def start(self, order: IOOrder) -> None:
        """Start ``order`` on this rank's shard (never raises: a failure is its outcome)."""
        running = _Running(order, [], bytearray(len(order.pairs)))
        self._running[order.job_id] = running
        kv, ready = copy_view(self.kv_cache), ready_event(self.kv_cache)
        try:
            if order.op in (SWAP_OUT, SWAP_IN):
                running.futures = self.mover.launch(order.op, kv, list(order.pairs),
                                                    order.owner, ready)
            else:
                running.futures = self.mover.launch_prefix(order.op, kv, list(order.pairs),
                                                           order.salt, order.hashes,
                                                           running.done, ready)
        except Exception as exc:  # never raise I/O trouble into the worker loop
            running.error = classify(exc)

    def wait(self, job_id: int, timeout: float | None) -> None:
        """Block until job ``job_id`` ended here (at most ``timeout`` seconds)."""
        running = self._running.get(job_id)
        if running is not None:
            cf.wait(running.futures, timeout=timeout)

    def finished(self) -> list[RankOutcome]:
        """The jobs that ended since the last call."""
        ended = [r for r in self._running.values() if all(f.done() for f in r.futures)]
        for running in ended:
            del self._running[running.order.job_id]
        return [self._outcome(r) for r in ended]

    def _outcome(self, running: _Running) -> RankOutcome:
        nbytes, error = 0, running.error
        for future in running.futures:
            exc = future.exception()
            if exc is None:
                nbytes += future.result()
            elif error is None:
                error = classify(exc)
        return RankOutcome(self.rank, running.order.job_id, nbytes, error, bytes(running.done))

    def close(self) -> None:
        """Cancel prefix I/O not started, wait for the rest, release the mover."""
        self.mover.cancel_queued()
        for running in list(self._running.values()):
            cf.wait(running.futures)
        self.mover.close()
