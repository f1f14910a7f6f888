"""The flash tier's two-stage chunk pipeline: CPU work and I/O on separate thread pools.

Each chunk (see :mod:`hifc.tiers.flash.chunks`) is a short list of stages, each marked ``CPU`` or
``IO``, that run in order on one set of staging buffers::

    swap-out:  acquire staging -> gather + crc32c + headers (CPU) -> write (IO) -> release
    swap-in:   acquire staging -> read (IO) -> verify + scatter (CPU) -> release

``IO`` stages run on the tier's ``io_threads`` I/O threads and do nothing but the backend call,
so as many I/Os are queued on the device as a raw O_DIRECT reader or writer with that many
threads would keep. ``CPU`` stages run on ``prep_threads`` other threads, filling (or draining)
further buffer sets while the I/O of earlier chunks is in flight. With one thread per chunk doing
both, as before, every thread left the device idle during its CPU work, and threads whose I/Os
shared the device finished together and did their CPU work together (on a 2-core VM: tier/raw
0.63 write, 0.67 read; see docs/RESULTS.md, "Flash tier I/O (issue 3)").

The pool holds ``io_threads + prep_threads`` buffer sets, so every I/O thread can have one in
flight while every CPU thread prepares another. A chunk waits for a set in a queue, never in a
thread (:class:`~hifc.tiers.flash.staging.BufferPool`), so the stages cannot deadlock. A chunk's future
completes after its last stage and after its buffers are back in the pool; an exception in any
stage skips the rest, returns the buffers and becomes the future's exception (the tier turns it
into a job error). The GIL is not held across the heavy work: ``os.pwritev``/``preadv``, torch
and numpy copies and crc32c of slices >= 32 KiB all release it.

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

from hifc.tiers.flash.staging import BufferPool, StagingBuffers

CPU = "cpu"
IO = "io"

Stage = tuple[str, Callable[[StagingBuffers], None]]
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
    """What one chunk needs: its buffer pool, its stages in order, and the payload bytes it
    moves (the future's result)."""

    pool: BufferPool
    stages: tuple[Stage, ...]
    nbytes: int


class ChunkPipeline:
    def __init__(self, io_pool: cf.Executor, cpu_pool: cf.Executor):
        self._executors = {IO: io_pool, CPU: cpu_pool}

    def submit(self, task: ChunkTask) -> cf.Future:
        """Start ``task`` (when a buffer set is free); its future gives ``task.nbytes``."""
        future: cf.Future = cf.Future()
        future.set_running_or_notify_cancel()
        task.pool.acquire(lambda buffers: self._schedule(task, future, buffers, 0))
        return future

    def _schedule(self, task: ChunkTask, future: cf.Future, buffers: StagingBuffers,
                  index: int) -> None:
        kind, _ = task.stages[index]
        try:
            self._executors[kind].submit(self._run, task, future, buffers, index)
        except BaseException as exc:  # the executor was shut down: fail, never raise
            self._finish(task, future, buffers, exc)

    def _run(self, task: ChunkTask, future: cf.Future, buffers: StagingBuffers,
             index: int) -> None:
        _, work = task.stages[index]
        try:
            work(buffers)
        except BaseException as exc:
            self._finish(task, future, buffers, exc)
            return
        if index + 1 == len(task.stages):
            self._finish(task, future, buffers, None)
        elif task.stages[index + 1][0] == task.stages[index][0]:
            self._run(task, future, buffers, index + 1)  # same pool: no hand-over
        else:
            self._schedule(task, future, buffers, index + 1)

    @staticmethod
    def _finish(task: ChunkTask, future: cf.Future, buffers: StagingBuffers,
                exc: BaseException | None) -> None:
        task.pool.release(buffers)  # before the future completes: a done job holds no buffers
        if exc is None:
            future.set_result(task.nbytes)
        else:
            future.set_exception(exc)
