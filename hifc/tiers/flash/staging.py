"""Staging buffers for the flash tier's chunk pipeline, and the pool that lends them.

A :class:`StagingBuffers` set holds one chunk laid out exactly like its bytes in the file:
``host`` (4 KiB aligned, pinned when CUDA is in play) is where checksums are computed;
``device`` (on the GPU, GPU KV caches only) is where gathers and scatters happen, so that
host<->device traffic is one contiguous copy; ``io`` is the one the backend transfers (``device``
when the backend moves GPU memory itself, as kvikio does, else ``host``); each set has its own
CUDA stream.

:class:`BufferPool` lends sets without ever blocking a thread. ``acquire(start)`` calls
``start(buffers)`` at once when a set is free, else queues ``start`` (first come, first served)
and calls it from the thread that gives the next set back. The pipeline's stages run on thread
pools; a stage that waited for a set could occupy the very thread that another chunk needs in
order to finish and give its set back, so nothing waits: a chunk enters the pipeline when a set
is free. All sets are allocated (and their pages faulted in) when the pool is built.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from typing import Callable

import torch

from hifc.tiers.flash.io_base import aligned_empty


class StagingBuffers:
    """One chunk's staging memory for KV caches on ``kv_device``."""

    def __init__(self, nbytes: int, kv_device: torch.device, io_device: torch.device):
        on_gpu = kv_device.type == "cuda"
        # zero-filled so that its pages are faulted in now, not during the first swaps
        self.host = aligned_empty(nbytes, torch.device("cpu"), pin=on_gpu).zero_()
        self.device = aligned_empty(nbytes, kv_device) if on_gpu else None
        self.io = self.device if on_gpu and io_device.type == "cuda" else self.host
        self.stream = torch.cuda.Stream(kv_device) if on_gpu else None

    @property
    def work(self) -> torch.Tensor:
        """Where gathers and scatters happen: next to the KV cache."""
        return self.device if self.device is not None else self.host

    def context(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else \
            contextlib.nullcontext()

    def sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int) -> None:
        """Copy the first ``nbytes`` between staging buffers on the set's stream and wait."""
        if dst.data_ptr() != src.data_ptr():
            with self.context():
                dst[:nbytes].copy_(src[:nbytes], non_blocking=True)
        self.sync()


class BufferPool:
    """A fixed number of :class:`StagingBuffers`, lent through callbacks (never a wait)."""

    def __init__(self, count: int, make: Callable[[], StagingBuffers]):
        if count < 1:
            raise ValueError(f"a buffer pool needs at least one buffer set, got {count}")
        self._free = [make() for _ in range(count)]
        self._waiting: collections.deque[Callable[[StagingBuffers], None]] = collections.deque()
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free)

    def acquire(self, start: Callable[[StagingBuffers], None]) -> None:
        """Call ``start(buffers)`` now if a set is free, else when one is given back.
        ``start`` must not raise and must not block; it owns the set until ``release``."""
        with self._lock:
            if not self._free:
                self._waiting.append(start)
                return
            buffers = self._free.pop()  # the most recently used set: its pages are warm
        start(buffers)

    def release(self, buffers: StagingBuffers) -> None:
        """Give a set back: to the oldest waiting ``start`` if any, else to the free list."""
        with self._lock:
            if not self._waiting:
                self._free.append(buffers)
                return
            start = self._waiting.popleft()
        start(buffers)
