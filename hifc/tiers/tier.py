"""``KVTier``: the object the engine holds for one swap tier (flash or pinned DRAM).

The tier's block space lives here, with the bookkeeping shared by every tier: the block
allocator, reservation and deferred freeing, pinning of blocks with I/O in flight, job
submission checks, polling and statistics. The data moves in a :class:`~hifc.tiers.mover.TierMover`
(on its own threads): the tier's own, and with tensor parallelism the other ranks' too, through
``peers`` (:class:`TierPeers`), which start every job on their shards and report back; a job is
done when every rank's part is, and failed if any part failed. Subclasses say how they are
built (and the flash tier adds its prefix store). All methods are meant to be called from one
thread (the engine's).
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import threading
import time
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from typing import Protocol

import torch

from hifc.dtypes import copy_dtype, dtype_name
from hifc.tiers.allocator import FCBlockAllocator
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.jobs import (ErrorKind, IOOrder, Job, JobStatus, RankOutcome, check_owner,
                             classify)
from hifc.tiers.mover import SWAP_IN, SWAP_OUT, TierMover

__all__ = ["KVTier", "SWAP_IN", "SWAP_OUT", "TierPeers", "copy_view", "ready_event"]


class TierPeers(Protocol):
    """The other tensor-parallel ranks' movers, as the engine's tier drives them."""

    size: int  # ranks, this one included

    def launch(self, order: IOOrder) -> None:
        """Start ``order`` on every other rank."""

    def collect(self) -> None:
        """Take in the outcomes the other ranks have reported (never blocks long)."""

    def request_wait(self, job_id: int, timeout: float | None) -> None:
        """Ask the other ranks to wait for ``job_id`` (at most ``timeout`` s) and report."""

    def staged(self, job_id: int) -> set[int]:
        """The pairs of swap-out ``job_id`` that every other rank has reported staged."""

    def tracks(self, job_id: int) -> bool:
        """Whether ``job_id`` was launched on the other ranks and not popped yet."""

    def is_done(self, job_id: int) -> bool:
        """Whether every other rank reported ``job_id`` ended."""

    def pop(self, job_id: int) -> list[RankOutcome]:
        """The other ranks' outcomes of an ended job (forgotten from then on)."""

    def cancel_queued(self) -> None:
        """Before a close: work not started may be cancelled, as this rank's mover's."""

    def close(self) -> None:
        """Every job has ended: the other ranks release their movers."""


def ready_event(kv_cache: torch.Tensor):
    """For a CUDA KV cache, an event after the work already queued on the caller's stream (the
    copies wait for it); None on the CPU."""
    if not kv_cache.is_cuda:
        return None
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(kv_cache.device))
    return ready


def copy_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The KV cache as the tiers move it: the same bytes, float8 viewed as uint8 (torch lacks
    float8 index kernels on the CPU; tiers never compute on the values)."""
    return kv_cache.view(copy_dtype(dtype_name(kv_cache.dtype)))


class KVTier:
    """``geometry``: the shape of one block of this rank's shard; ``mover``: this rank's;
    ``peers``: the other tensor-parallel ranks' (None with one rank)."""

    kind = ""

    def __init__(self, geometry: KVGeometry, num_blocks: int, policy: str, mover: TierMover,
                 peers: TierPeers | None = None):
        self.geometry = geometry
        self.allocator = FCBlockAllocator(num_blocks, policy)
        self.mover = mover
        self.peers = peers
        self._pending: list[Job] = []
        self._inflight: Counter[int] = Counter()  # tier block -> jobs touching it
        self._free_after_io: set[int] = set()
        self._next_job_id = 0
        self._counts: Counter[str] = Counter()
        self._closed = False
        # notified by the workers when a piece of a job ends or a swap-out stages blocks
        self._progress = threading.Condition()

    # -- capacity ----------------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        """Tensor-parallel ranks whose shards every job moves."""
        return self.peers.size if self.peers is not None else 1

    @property
    def block_bytes(self) -> int:
        """KV bytes one tier block holds, all ranks' shards together (what a job moves per
        block)."""
        return self.geometry.block_bytes * self.num_ranks

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def can_reserve(self, n: int) -> bool:
        """Whether ``reserve(n)`` would succeed now (changes nothing)."""
        return self.allocator.can_allocate(n)

    def reserve(self, n: int) -> list[int]:
        """Reserve ``n`` tier blocks in policy order. ValueError if fewer are free."""
        self._check_open()
        return self.allocator.allocate(n)

    def free(self, tier_block_ids) -> None:
        """Give blocks back. Blocks with I/O in flight are freed when that I/O completes."""
        ids = list(tier_block_ids)
        for block in ids:
            if not self._is_reserved(block):
                raise ValueError(f"tier block {block!r} is not reserved (double free?)")
        if len(set(ids)) != len(ids):
            raise ValueError("free() got the same tier block twice")
        now = [b for b in ids if not self._inflight[b]]
        self._free_after_io.update(b for b in ids if self._inflight[b])
        self.allocator.free(now)

    # -- submission --------------------------------------------------------------------------
    def submit_swap_out(self, kv_cache: torch.Tensor, pairs, owner) -> Job:
        """Copy KV blocks ``kv_cache[:, :, gpu]`` to reserved tier blocks; pairs are
        (gpu_block, tier_block). Returns at once; the job reports the outcome."""
        return self._submit(SWAP_OUT, kv_cache, pairs, owner)

    def submit_swap_in(self, kv_cache: torch.Tensor, pairs, owner) -> Job:
        """Copy tier blocks back into ``kv_cache``; pairs are (tier_block, gpu_block). The
        records are verified first; a failed job leaves the destination contents undefined."""
        return self._submit(SWAP_IN, kv_cache, pairs, owner)

    def swap_out_blocks(self, kv_cache: torch.Tensor, gpu_block_ids, owner) -> Job:
        """Reserve tier blocks and swap out to them; a TIER_FULL job if they are not free.
        On failure the caller frees ``job.tier_blocks`` (if any), as for any swap-out."""
        ids = list(gpu_block_ids)
        if not self.can_reserve(len(ids)):
            job = self._new_job(SWAP_OUT, (), check_owner(owner))
            job.fail(ErrorKind.TIER_FULL, f"tier full: {len(ids)} blocks needed, "
                     f"{self.num_free_blocks} of {self.num_blocks} free")
            return job
        return self.submit_swap_out(kv_cache, list(zip(ids, self.reserve(len(ids)))), owner)

    def _is_reserved(self, block) -> bool:
        """Whether ``block`` is a caller's reservation (may be freed, swapped to or from)."""
        return self.allocator.is_allocated(block) and block not in self._free_after_io

    def _new_job(self, op: str, pairs, owner) -> Job:
        return self._track(Job(self._new_job_id(), op, tuple(pairs), owner))

    def _new_job_id(self) -> int:
        self._next_job_id += 1
        return self._next_job_id

    def _track(self, job: Job) -> Job:
        """Make ``job`` pending: reported once by ``poll`` or ``wait``."""
        self._pending.append(job)
        return job

    def _submit(self, op: str, kv_cache: torch.Tensor, pairs, owner) -> Job:
        self._check_open()
        owner = check_owner(owner)
        pairs = self._check_pairs(op, kv_cache, pairs)
        job = self._new_job(op, pairs, owner)
        tier_ids = job.tier_blocks
        busy = [b for b in tier_ids if self._inflight[b]]
        if busy:
            job.fail(ErrorKind.BUSY, f"tier blocks {busy[:8]} still have I/O in flight")
            return job
        if not pairs:
            return job
        ready = ready_event(kv_cache)
        if op == SWAP_OUT:
            self.allocator.mark_written(tier_ids)
        self._inflight.update(tier_ids)
        job._pinned = tuple(tier_ids)
        # a swap-out's GPU blocks may be reused once staged (on every rank: ``take_staged``)
        staged = functools.partial(self._note_staged, job) if op == SWAP_OUT else None
        self._launch(job, lambda: self.mover.launch(op, copy_view(kv_cache), list(pairs), owner,
                                                    ready, staged),
                     IOOrder(job.job_id, op, tuple(pairs), owner))
        return job

    def _launch(self, job: Job, start, order: IOOrder) -> None:
        """Start ``job`` here (``start()`` returns its futures) and on the other ranks. Once it
        is started anywhere it ends only when every rank reported: until then its KV blocks
        may still be read or written on some rank, even if this rank's part failed."""
        try:
            job._futures = start()
            self._watch(job)
        except Exception as exc:  # never raise I/O trouble into the engine
            job.fail(*classify(exc))
        if self.peers is not None:
            self.peers.launch(order)

    def _watch(self, job: Job) -> None:
        """Note when each piece of ``job`` ends (its I/O time, ``wait_progress``)."""
        for future in job._futures:
            future.add_done_callback(job.note_io_done)
            future.add_done_callback(self._notify)

    def _notify(self, _future: cf.Future | None = None) -> None:
        with self._progress:
            self._progress.notify_all()

    def _note_staged(self, job: Job, first: int, count: int) -> None:
        """(A worker thread) pairs ``first ... first + count - 1`` of the swap-out ``job``
        have left the KV cache: their data is in the tier's memory, on its way to the tier."""
        with self._progress:
            job._staged.update(range(first, first + count))
            self._progress.notify_all()

    def _check_pairs(self, op: str, kv: torch.Tensor, pairs) -> list[tuple[int, int]]:
        self._check_kv(kv)
        out = []
        for pair in pairs:
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
                raise ValueError(f"swap pairs must be (src, dst) int pairs, got {pair!r}")
            out.append((pair[0], pair[1]))
        tier_ids = [p[1] for p in out] if op == SWAP_OUT else [p[0] for p in out]
        gpu_ids = [p[0] for p in out] if op == SWAP_OUT else [p[1] for p in out]
        for block in tier_ids:
            if not self._is_reserved(block):
                raise ValueError(f"tier block {block} is not reserved")
        self._check_gpu_ids(kv, gpu_ids)
        if len(set(tier_ids)) != len(tier_ids):
            raise ValueError("swap pairs repeat a tier block id")
        return out

    def _check_gpu_ids(self, kv: torch.Tensor, gpu_ids: list[int]) -> None:
        for block in gpu_ids:
            if not 0 <= block < kv.shape[2]:
                raise ValueError(f"KV cache block {block} out of range [0, {kv.shape[2]})")
        if len(set(gpu_ids)) != len(gpu_ids):
            raise ValueError("pairs repeat a KV cache block id")

    def _check_kv(self, kv: torch.Tensor) -> None:
        g = self.geometry
        if not isinstance(kv, torch.Tensor) or kv.dim() != 6:
            raise ValueError("kv_cache must be a 6-D tensor [layers, 2, blocks, block_size, "
                             "kv_heads, head_dim]")
        want = (g.num_layers, 2, g.block_size, g.num_kv_heads, g.head_dim)
        have = (kv.shape[0], kv.shape[1], *kv.shape[3:])
        if have != want:
            raise ValueError(f"kv_cache shape {tuple(kv.shape)} does not match the tier geometry "
                             f"[{g.num_layers}, 2, *, {g.block_size}, {g.num_kv_heads}, "
                             f"{g.head_dim}]")
        if str(kv.dtype).removeprefix("torch.") != g.dtype:
            raise ValueError(f"kv_cache dtype {kv.dtype} does not match the tier dtype {g.dtype}")

    # -- completion --------------------------------------------------------------------------
    def poll(self) -> list[Job]:
        """Jobs that finished since the last poll (never blocks long). Each job is reported
        once, by ``poll`` or by ``wait``."""
        if self.peers is not None:
            self.peers.collect()
        finished = [j for j in self._pending if self._ended(j)]
        for job in finished:
            self._finish(job)
        return finished

    def wait(self, job: Job, timeout: float | None = None) -> Job:
        """Block until ``job`` finishes (or ``timeout`` seconds pass: then it is still
        PENDING). A job finished here is not reported again by ``poll``."""
        if job in self._pending:
            self._wait_io(job, timeout)
            if self._ended(job):
                self._finish(job)
        return job

    def _wait_io(self, job: Job, timeout: float | None) -> None:
        """Block until ``job``'s I/O has ended on every rank (or ``timeout`` seconds pass)."""
        on_peers = self.peers is not None and self.peers.tracks(job.job_id)
        if on_peers:
            self.peers.request_wait(job.job_id, timeout)
        cf.wait(job._futures, timeout=timeout)
        if on_peers:
            self.peers.collect()

    def take_staged(self, job: Job) -> list[int]:
        """Indices into ``job.pairs`` of a pending swap-out whose KV cache blocks the tier has
        copied into its own memory since the last call, on every rank (the others' reports
        come with ``poll``), while the job goes on writing them: the caller may reuse those
        blocks now. Empty for other jobs and once the job is done (then all its KV cache
        blocks are free, whether it succeeded or not)."""
        with self._progress:
            if job.done:
                return []
            new = job._staged - job._taken
            if new and self.peers is not None and self.peers.tracks(job.job_id):
                new &= self.peers.staged(job.job_id)
            job._taken |= new
        return sorted(new)

    def wait_progress(self, timeout: float | None = None) -> None:
        """Block until a pending job's I/O has ended or a swap-out has staged blocks not
        taken yet (or ``timeout`` seconds pass); ``poll`` and ``take_staged`` then tell which.
        With other ranks (which report only when asked), waits for the oldest job's I/O to end
        on every rank: their staging is taken in at each ``poll``, not waited for."""
        if self.peers is not None:
            if self._pending:
                self._wait_io(self._pending[0], timeout)
            return
        with self._progress:
            self._progress.wait_for(self._has_progress, timeout)

    def _has_progress(self) -> bool:
        return any(job._staged - job._taken or self._ended(job) for job in self._pending)

    def _ended(self, job: Job) -> bool:
        """Whether ``job``'s I/O has ended on every rank."""
        if not all(f.done() for f in job._futures):
            return False
        return self.peers is None or not self.peers.tracks(job.job_id) \
            or self.peers.is_done(job.job_id)

    def stalled(self) -> AbstractContextManager:
        """Entered while the engine waits for this tier's I/O with nothing else to run; a tier
        whose device other engines share lets that I/O go first meanwhile."""
        return nullcontext()

    def wait_all(self) -> list[Job]:
        jobs = list(self._pending)
        for job in jobs:
            self.wait(job)
        return jobs

    def _finish(self, job: Job) -> None:
        self._pending.remove(job)
        for future in job._futures:
            exc = future.exception()
            if exc is not None:
                job.fail(*classify(exc))
            else:
                job.nbytes += future.result()
        job._futures = []
        if self.peers is not None and self.peers.tracks(job.job_id):
            self._merge(job, self.peers.pop(job.job_id))
        if job.status is JobStatus.PENDING:
            job.status = JobStatus.OK
        self._on_finished(job)
        self._inflight.subtract(job._pinned)
        self._inflight = +self._inflight  # drop zero counts
        release = [b for b in job._pinned if b in self._free_after_io and not self._inflight[b]]
        self._free_after_io.difference_update(release)
        self.allocator.free(release)
        self._counts[f"{job.op}_{'ok' if job.ok else 'failed'}"] += 1
        self._counts[f"{job.op}_bytes"] += job.nbytes if job.ok else 0
        if job.error_kind is not None:
            self._counts[f"error_{job.error_kind.value}"] += 1
        job.finished_at = time.perf_counter()

    def _merge(self, job: Job, outcomes: list[RankOutcome]) -> None:
        """Fold the other ranks' outcomes into ``job``: their bytes, their first error."""
        for outcome in outcomes:
            job.nbytes += outcome.nbytes
            if outcome.error is not None:
                kind, message, code = outcome.error
                job.fail(kind, f"rank {outcome.rank}: {message}", code)

    # -- statistics and shutdown ---------------------------------------------------------------
    def stats(self) -> dict:
        alloc = self.allocator.stats()
        out = {"kind": self.kind, "num_blocks": self.num_blocks,
               "num_free_blocks": self.num_free_blocks, "block_bytes": self.block_bytes,
               "ranks": self.num_ranks,
               "inflight_blocks": len(self._inflight), "pending_jobs": len(self._pending),
               "allocator": {**asdict(alloc), "mean_run_blocks": alloc.mean_run_blocks}}
        out.update(self._counts)
        out.update(self.mover.stats())
        out.update(self._extra_stats())
        return out

    def _extra_stats(self) -> dict:
        return {}

    def _on_finished(self, job: Job) -> None:
        """A subclass's bookkeeping once ``job``'s status is final (before its blocks unpin)."""

    def close(self) -> None:
        """Wait for jobs in flight (prefix I/O not started is cancelled), stop the movers and
        release files and memory."""
        if self._closed:
            return
        self.mover.cancel_queued()
        if self.peers is not None:
            self.peers.cancel_queued()
        self.wait_all()
        self._closed = True
        self.mover.close()
        if self.peers is not None:
            self.peers.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {self.kind} tier is closed")

    def __enter__(self) -> "KVTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

