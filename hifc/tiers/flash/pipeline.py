"""The flash tier's two-stage chunk pipeline: CPU work and I/O on separate thread pools.

Each chunk (see :mod:`hifc.tiers.flash.chunks`) is a short list of stages, each marked ``CPU``,
``WORK`` (CPU work that needs a work buffer: on the GPU, for GPU caches) or ``IO``, that run in
order on one host staging set::

    swap-out:  acquire a set -> gather + copy to the host (WORK; GPU caches) or gather (CPU)
               -> crc32c + headers (CPU) -> write (IO) -> release
    swap-in:   acquire a set -> read (IO) -> verify + scatter (WORK; GPU caches, or CPU)
               -> release

``IO`` stages run on the tier's ``io_threads`` I/O threads and do nothing but the backend call,
so as many I/Os are queued on the device as a raw O_DIRECT reader or writer with that many
threads would keep. ``CPU`` and ``WORK`` stages run on ``prep_threads`` other threads, filling
(or draining) further sets while the I/O of earlier chunks is in flight. With one thread per
chunk doing both, as before, every thread left the device idle during its CPU work, and threads
whose I/Os shared the device finished together and did their CPU work together (on a 2-core VM:
tier/raw 0.63 write, 0.67 read; see docs/RESULTS.md, "Flash tier I/O (issue 3)").

A chunk takes a host set when it enters the pipeline and keeps it to its end (a swap-out's set
holds the only copy of its blocks until the write ends). A ``WORK`` stage borrows a work buffer
from ``task.work_pool`` just for that stage (or uses the set's own, where the backend transfers
GPU memory) and gives it back as soon as it ends. Chunks wait for sets and work buffers in
queues, never in a thread (:class:`~hifc.tiers.flash.staging.BufferPool`), sets are always taken
before work buffers, and a work buffer is given back without waiting for anything, so the
stages cannot deadlock. A chunk's future completes after its last stage and after its buffers
are back in their pools; an exception in any stage skips the rest, returns the buffers and
becomes the future's exception (the tier turns it into a job error). The GIL is not held across
the heavy work: ``os.pwritev``/``preadv``, torch and numpy copies and crc32c of slices >= 32 KiB
all release it.

On Linux the CPU-stage threads run at a lower priority (nice +``PREP_NICE``, those threads
only): when an I/O completes, its thread gets a core at once to issue the next I/O instead of
waiting behind a gather or a checksum. Measured on the 2-core CPU machine (6 paired runs of
``hifc bench io``): read tier/raw median 0.98 with it, 0.91 without; writes 0.90 vs 0.87.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import sys
from dataclasses import dataclass
from typing import Callable

from hifc.tiers.flash.staging import BufferPool, StagingBuffers, WorkBuffer

CPU = "cpu"
IO = "io"
WORK = "work"  # a CPU stage that holds a work buffer (a GPU buffer for GPU caches) while it runs

Stage = tuple[str, Callable[..., None]]  # WORK: (buffers, work buffer); else (buffers)
PREP_NICE = 10


def lower_thread_priority(increment: int = PREP_NICE) -> None:
    """Raise the calling thread's nice value (a thread pool initializer). Only on Linux, where
    nice is per thread; elsewhere it would apply to the whole process, so nothing is done."""
    if not sys.platform.startswith("linux") or increment <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + increment)
    except OSError:  # a sandbox that forbids it: run at normal priority
        pass


def cpu_stage_pool(threads: int, name: str) -> cf.ThreadPoolExecutor:
    """The executor for CPU stages: ``threads`` threads at lowered priority."""
    return cf.ThreadPoolExecutor(threads, thread_name_prefix=name,
                                 initializer=lower_thread_priority)


@dataclass(frozen=True)
class ChunkTask:
    """What one chunk needs: its host staging sets, its stages in order, the payload bytes it
    moves (the future's result), and the work buffers its ``WORK`` stages borrow (None: the
    sets own theirs)."""

    pool: BufferPool[StagingBuffers]
    stages: tuple[Stage, ...]
    nbytes: int
    work_pool: BufferPool[WorkBuffer] | None = None


class ChunkPipeline:
    def __init__(self, io_pool: cf.Executor, cpu_pool: cf.Executor):
        self._executors = {IO: io_pool, CPU: cpu_pool, WORK: cpu_pool}

    def submit(self, task: ChunkTask) -> cf.Future:
        """Start ``task`` (when a host set is free); its future gives ``task.nbytes``."""
        future: cf.Future = cf.Future()
        future.set_running_or_notify_cancel()
        task.pool.acquire(lambda buffers: self._schedule(task, future, buffers, 0))
        return future

    def _schedule(self, task: ChunkTask, future: cf.Future, buffers: StagingBuffers,
                  index: int) -> None:
        """Queue stage ``index`` on its executor; a ``WORK`` stage once it has a work buffer
        (the set's own, or one lent by ``task.work_pool``: queued there while none is free)."""
        if task.stages[index][0] != WORK:
            self._submit(task, future, buffers, index, None)
        elif buffers.gpu is not None:
            self._submit(task, future, buffers, index, buffers.gpu)
        else:
            task.work_pool.acquire(
                lambda work: self._submit(task, future, buffers, index, work))

    def _submit(self, task: ChunkTask, future: cf.Future, buffers: StagingBuffers, index: int,
                work: WorkBuffer | None) -> None:
        try:
            self._executors[task.stages[index][0]].submit(self._run, task, future, buffers,
                                                          index, work)
        except BaseException as exc:  # the executor was shut down: fail, never raise
            self._give_back_work(task, buffers, work)
            self._finish(task, future, buffers, exc)

    def _run(self, task: ChunkTask, future: cf.Future, buffers: StagingBuffers, index: int,
             work: WorkBuffer | None) -> None:
        kind, run = task.stages[index]
        try:
            run(buffers, work) if kind == WORK else run(buffers)
        except BaseException as exc:
            self._give_back_work(task, buffers, work)
            self._finish(task, future, buffers, exc)
            return
        self._give_back_work(task, buffers, work)  # right after its stage: others may use it
        if index + 1 == len(task.stages):
            self._finish(task, future, buffers, None)
        elif (next_kind := task.stages[index + 1][0]) != WORK and \
                self._executors[next_kind] is self._executors[kind]:
            self._run(task, future, buffers, index + 1, None)  # same threads: no hand-over
        else:
            self._schedule(task, future, buffers, index + 1)

    @staticmethod
    def _give_back_work(task: ChunkTask, buffers: StagingBuffers,
                        work: WorkBuffer | None) -> None:
        if work is not None and work is not buffers.gpu:
            task.work_pool.release(work)

    @staticmethod
    def _finish(task: ChunkTask, future: cf.Future, buffers: StagingBuffers,
                exc: BaseException | None) -> None:
        task.pool.release(buffers)  # before the future completes: a done job holds no buffers
        if exc is None:
            future.set_result(task.nbytes)
        else:
            future.set_exception(exc)
