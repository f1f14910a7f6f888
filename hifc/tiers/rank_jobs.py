"""``RankJobs``: a tensor-parallel worker rank's side of the tier jobs.

The engine's tier (rank 0) decides every job and sends each rank its ``IOOrder``; here a worker
rank starts the order on its own mover over its own KV shard, and reports how each job ended
(``RankOutcome``) when asked, with the blocks its swap-outs still writing have staged since the
last answer (``RankReport``): rank 0 frees a GPU block once every rank has staged it. A job's outcome on the engine's side is the combination of every
rank's (:meth:`hifc.tiers.tier.KVTier.poll`): it is done when all ranks are, and failed if any
failed, so a failure on one rank turns the swap into a recompute as one failure does alone.
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import threading
from dataclasses import dataclass, field

import torch

from hifc.tiers.jobs import IOOrder, RankOutcome, RankReport, classify
from hifc.tiers.mover import SWAP_IN, SWAP_OUT, TierMover
from hifc.tiers.tier import copy_view, ready_event


@dataclass
class _Running:
    order: IOOrder
    futures: list[cf.Future]
    done: bytearray = field(default_factory=bytearray)  # prefix jobs, per pair
    error: tuple | None = None  # a failure to start
    staged: list[int] = field(default_factory=list)  # swap-outs: staged, not reported yet


class RankJobs:
    def __init__(self, rank: int, mover: TierMover, kv_cache: torch.Tensor):
        self.rank = rank
        self.mover = mover
        self.kv_cache = kv_cache  # this rank's [L, 2, N, bs, Hkv / tp, D]
        self._running: dict[int, _Running] = {}
        self._lock = threading.Lock()  # the staged lists (appended by the mover's threads)

    def start(self, order: IOOrder) -> None:
        """Start ``order`` on this rank's shard (never raises: a failure is its outcome)."""
        running = _Running(order, [], bytearray(len(order.pairs)))
        self._running[order.job_id] = running
        kv, ready = copy_view(self.kv_cache), ready_event(self.kv_cache)
        try:
            if order.op in (SWAP_OUT, SWAP_IN):
                staged = (functools.partial(self._note_staged, running)
                          if order.op == SWAP_OUT else None)
                running.futures = self.mover.launch(order.op, kv, list(order.pairs),
                                                    order.owner, ready, staged)
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

    def _note_staged(self, running: _Running, first: int, count: int) -> None:
        with self._lock:
            running.staged.extend(range(first, first + count))

    def report(self) -> RankReport:
        """The jobs that ended since the last call, and the pairs the others have staged."""
        ended = [r for r in self._running.values() if all(f.done() for f in r.futures)]
        for running in ended:
            del self._running[running.order.job_id]
        staged = {}
        with self._lock:
            for job_id, running in self._running.items():
                if running.staged:
                    staged[job_id], running.staged = running.staged, []
        return RankReport([self._outcome(r) for r in ended], staged)

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
