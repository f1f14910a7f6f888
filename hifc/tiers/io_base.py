"""The one interface every flash I/O backend implements, plus aligned staging buffers.

A backend moves bytes between a contiguous 1-D ``uint8`` torch tensor (host or device memory)
and the cache file. ``read``/``write`` are blocking and thread-safe; the tier calls them from its
I/O worker threads, which is where batching, coalescing and overlap happen (see
:mod:`hifc.tiers.swapper`). They raise ``OSError`` (with an errno) on failure and return the
number of bytes moved; a read that returns fewer bytes than asked is a short read.

Implementations: :class:`hifc.tiers.posix_io.PosixIO` (``O_DIRECT`` where the file system allows
it, else buffered) and :class:`hifc.tiers.kvikio_io.KvikioIO` (cuFile: GPUDirect Storage where the
driver is present, kvikio's compat mode elsewhere). :class:`hifc.tiers.faults.FaultyIO` wraps
either to inject faults in tests.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from hifc.tiers.layout import ALIGN


class FileIO(ABC):
    name: str = ""
    direct: bool = False  # True when I/O bypasses the page cache (O_DIRECT or GDS)

    def __init__(self) -> None:
        self.notes: list[str] = []  # human-readable facts about the I/O path in effect

    @abstractmethod
    def staging_device(self, kv_device: torch.device) -> torch.device:
        """Where staging buffers for a KV cache on ``kv_device`` should live."""

    @abstractmethod
    def write(self, buf: torch.Tensor, file_offset: int) -> int:
        """Write all of ``buf`` at ``file_offset``; returns bytes written."""

    @abstractmethod
    def read(self, buf: torch.Tensor, file_offset: int) -> int:
        """Fill ``buf`` from ``file_offset``; returns bytes read (fewer = short read)."""

    def close(self) -> None:  # pragma: no cover - trivial default
        pass


def aligned_empty(nbytes: int, device: torch.device, pin: bool = False) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` whose first byte is 4 KiB aligned."""
    device = torch.device(device)
    pin = pin and device.type == "cpu" and torch.cuda.is_available()
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, device=device, pin_memory=pin)
    skip = (-raw.data_ptr()) % ALIGN
    return raw[skip:skip + nbytes]


def host_view(buf: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU uint8 tensor, without copying."""
    if buf.device.type != "cpu" or not buf.is_contiguous():
        raise ValueError("host_view needs a contiguous CPU tensor")
    return memoryview(buf.numpy()).cast("B")
