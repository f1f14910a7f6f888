"""Staging memory for the flash tier's chunk pipeline, and the pools that lend it.

Two kinds of buffers, each a chunk laid out exactly like its bytes in the file:

* a host staging set (:class:`StagingBuffers`): ``host`` (4 KiB aligned, pinned when CUDA is in
  play) is where checksums are computed and, for host I/O (POSIX), what is written or read; a
  swap-out's chunk keeps its set from its gather until its write ends, the set holding the only
  copy of blocks the engine may already reuse. Sets come from one allocation of
  ``flash_staging_mib`` (:func:`host_set_count`), many more than the pipeline's threads, so that
  a victim larger than the pipeline's depth is staged at copy speed, not at the disk's;
* a work buffer (:class:`WorkBuffer`, on the GPU, GPU KV caches only) with its own CUDA stream:
  where gathers and scatters happen, so that host<->device traffic is one contiguous copy. A
  chunk holds one only during the CPU-thread stage that gathers and copies it to the host
  (swap-out) or copies it from the host and scatters it (swap-in), so one per prep thread keeps
  every thread busy: GPU staging memory stays ``prep_threads`` chunks however large the host
  staging is.

Where the backend moves GPU memory itself (kvikio: ``io_device`` is the GPU), the I/O needs the
GPU copy until it ends, so each set keeps a work buffer of its own (``gpu``, and ``io`` is its
data); those sets are as many as the pipeline's threads, as before.

:class:`BufferPool` lends buffers without ever blocking a thread. ``acquire(start)`` calls
``start(buffer)`` at once when one is free, else queues ``start`` (first come, first served) and
calls it from the thread that gives the next one back. The pipeline's stages run on thread
pools; a stage that waited for a buffer could occupy the very thread that another chunk needs in
order to finish and give its buffer back, so nothing waits. A chunk takes its host set first and
a work buffer second, and gives the work buffer back when that stage ends, without waiting for
anything: no cycle, so no deadlock. All buffers are allocated (and their pages faulted in) when
the pool is built.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

import torch

from hifc.tiers.flash.io_base import aligned_empty
from hifc.tiers.flash.layout import ALIGN

T = TypeVar("T")


class WorkBuffer:
    """``nbytes`` next to a KV cache on ``device``, with its own CUDA stream (none on a CPU)."""

    def __init__(self, nbytes: int, device: torch.device):
        self.data = aligned_empty(nbytes, device)  # [nbytes] uint8
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def context(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else \
            contextlib.nullcontext()

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Work queued on this buffer's stream from now on waits for ``event`` (if any)."""
        if event is not None and self.stream is not None:
            self.stream.wait_event(event)

    def sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int) -> None:
        """Copy the first ``nbytes`` from ``src`` to ``dst`` on this buffer's stream and wait
        (nothing to copy when both are the same memory)."""
        if dst.data_ptr() != src.data_ptr():
            with self.context():
                dst[:nbytes].copy_(src[:nbytes], non_blocking=True)
        self.sync()


class StagingBuffers:
    """One chunk's host staging: ``host``; ``gpu``, its own work buffer where the backend
    transfers GPU memory (else None: work buffers are lent per stage); ``io``, what the backend
    transfers."""

    def __init__(self, host: torch.Tensor, gpu: WorkBuffer | None = None):
        self.host = host  # [nbytes] uint8, 4 KiB aligned
        self.gpu = gpu
        self.io = gpu.data if gpu is not None else host


class BufferPool(Generic[T]):
    """A fixed set of buffers, lent through callbacks (never a wait)."""

    def __init__(self, buffers: list[T]):
        if not buffers:
            raise ValueError("a buffer pool needs at least one buffer")
        self.size = len(buffers)
        self._free = list(buffers)
        self._waiting: collections.deque[Callable[[T], None]] = collections.deque()
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free)

    def acquire(self, start: Callable[[T], None]) -> None:
        """Call ``start(buffer)`` now if one is free, else when one is given back.
        ``start`` must not raise and must not block; it owns the buffer until ``release``."""
        with self._lock:
            if not self._free:
                self._waiting.append(start)
                return
            buffer = self._free.pop()  # the most recently used one: its pages are warm
        start(buffer)

    def release(self, buffer: T) -> None:
        """Give a buffer back: to the oldest waiting ``start`` if any, else to the free list."""
        with self._lock:
            if not self._waiting:
                self._free.append(buffer)
                return
            start = self._waiting.popleft()
        start(buffer)


@dataclass(frozen=True)
class Staging:
    """The staging of one KV cache device: host ``sets`` and, where gathers and scatters happen
    apart from the host sets, the ``work`` buffers lent per stage (or each set's own, where
    ``sets_own_work``)."""

    sets: BufferPool[StagingBuffers]
    work: BufferPool[WorkBuffer] | None
    set_bytes: int
    sets_own_work: bool = False

    @property
    def uses_work(self) -> bool:
        """Whether gathers and scatters happen in work buffers (else in the host sets)."""
        return self.work is not None or self.sets_own_work

    @property
    def host_bytes(self) -> int:
        return self.sets.size * set_stride(self.set_bytes)

    @property
    def work_bytes(self) -> int:
        """Staging memory next to the KV cache (on the GPU for GPU caches)."""
        if self.sets_own_work:
            return self.sets.size * self.set_bytes
        return self.work.size * self.set_bytes if self.work is not None else 0


def set_stride(nbytes: int) -> int:
    """Bytes a host set of ``nbytes`` takes in the staging allocation (4 KiB aligned)."""
    return -(-nbytes // ALIGN) * ALIGN


def host_set_count(staging_bytes: int, set_bytes: int, at_least: int, at_most: int) -> int:
    """Host sets in ``staging_bytes`` of host staging: as many as fit, with the allocation's
    alignment slack (torch rounds pinned allocations up to a power of two: a power-of-two
    ``staging_bytes`` then wastes nothing), no fewer than ``at_least`` (the pipeline's depth),
    no more than ``at_most`` (enough for the whole tier)."""
    fitting = max(0, staging_bytes - ALIGN) // set_stride(set_bytes)
    return max(at_least, min(fitting, at_most))


def build_staging(kv_device: torch.device, io_device: torch.device, set_bytes: int,
                  num_sets: int, num_work: int, work_buffers: bool | None = None) -> Staging:
    """Staging for KV caches on ``kv_device`` whose backend transfers ``io_device`` memory.

    ``work_buffers``: gather and scatter in work buffers next to the KV cache (None: for GPU
    caches; CPU caches gather straight into the host sets, checksumming in cache, see
    :mod:`~hifc.tiers.flash.hostcopy`). The backend moving GPU memory makes each of the
    ``num_sets`` sets own a work buffer; otherwise ``num_work`` are lent per stage."""
    on_gpu = kv_device.type == "cuda"
    if work_buffers is None:
        work_buffers = on_gpu
    stride = set_stride(set_bytes)
    # one allocation: torch would round each pinned set up to a power of two on its own
    # zero-filled so that its pages are faulted in now, not during the first swaps
    slab = aligned_empty(num_sets * stride, torch.device("cpu"), pin=on_gpu).zero_()
    hosts = [slab[i * stride:i * stride + set_bytes] for i in range(num_sets)]
    if work_buffers and io_device.type == "cuda":  # the I/O itself needs the GPU copy
        sets = [StagingBuffers(host, WorkBuffer(set_bytes, kv_device)) for host in hosts]
        return Staging(BufferPool(sets), None, set_bytes, sets_own_work=True)
    work = (BufferPool([WorkBuffer(set_bytes, kv_device) for _ in range(num_work)])
            if work_buffers else None)
    return Staging(BufferPool([StagingBuffers(host) for host in hosts]), work, set_bytes)
