"""The one interface every flash I/O backend implements, plus aligned staging buffers.

A backend moves bytes between a contiguous 1-D ``uint8`` torch tensor (host or device memory)
and the cache file. ``read``/``write`` are blocking and thread-safe; the tier calls them from its
I/O worker threads, which is where batching, coalescing and overlap happen (see
:mod:`hifc.tiers.flash.chunks`). They raise ``OSError`` (with an errno) on failure and return the
number of bytes moved; a read that returns fewer bytes than asked is a short read. Each call
says who waits for it (``IOPriority``); backends that share a device with other engine replicas
(:class:`hifc.tiers.flash.arbiter.ArbitratedIO`) admit I/O in that order, the others ignore it.

Implementations: :class:`hifc.tiers.flash.posix_io.PosixIO` (``O_DIRECT`` where the file system allows
it, else buffered) and :class:`hifc.tiers.flash.kvikio_io.KvikioIO` (cuFile: GPUDirect Storage where the
driver is present, kvikio's compat mode elsewhere). :class:`hifc.tiers.flash.faults.FaultyIO` wraps
either to inject faults in tests.

Host staging buffers of 2 MiB or more (not pinned) are anonymous mappings advised to use
transparent huge pages (``MADV_HUGEPAGE``) where the kernel allows it. An ``O_DIRECT`` I/O is
split into device requests of at most ``max_segments`` physically contiguous pieces; buffers of
scattered 4 KiB pages (what a malloc'd buffer faulted in by several threads tends to get) turn a
24 MiB I/O into ~25 requests of ~1 MiB, huge pages into 6 of 4 MiB. Measured on the 2-core CPU
machine's virtio disk: raw O_DIRECT from huge-page buffers 5.5 GiB/s write, 2.5 read; from
ordinary buffers 2.9 and 1.3 (docs/RESULTS.md, "Flash tier I/O (issue 3)").
"""
from __future__ import annotations

import mmap
from abc import ABC, abstractmethod
from enum import IntEnum

import torch

from hifc.tiers.flash.layout import ALIGN

HUGE_PAGE = 2 << 20  # x86-64 / arm64 (4 KiB base pages) PMD size


class IOPriority(IntEnum):
    """Who waits for an I/O, most urgent first."""

    SWAP_IN = 0  # a preempted sequence resumes when its read completes
    SWAP_OUT = 1  # its write holds GPU blocks that other sequences wait for
    PREFIX_WRITE = 2  # nobody waits: a record stored for later reuse


class FileIO(ABC):
    name: str = ""
    direct: bool = False  # True when I/O bypasses the page cache (O_DIRECT or GDS)

    def __init__(self) -> None:
        self.notes: list[str] = []  # human-readable facts about the I/O path in effect

    @abstractmethod
    def staging_device(self, kv_device: torch.device) -> torch.device:
        """Where staging buffers for a KV cache on ``kv_device`` should live."""

    @abstractmethod
    def write(self, buf: torch.Tensor, file_offset: int,
              priority: IOPriority = IOPriority.SWAP_OUT) -> int:
        """Write all of ``buf`` at ``file_offset``; returns bytes written."""

    @abstractmethod
    def read(self, buf: torch.Tensor, file_offset: int,
             priority: IOPriority = IOPriority.SWAP_IN) -> int:
        """Fill ``buf`` from ``file_offset``; returns bytes read (fewer = short read)."""

    def close(self) -> None:  # pragma: no cover - trivial default
        pass


def aligned_empty(nbytes: int, device: torch.device, pin: bool = False) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` whose first byte is 4 KiB aligned (2 MiB aligned and on
    huge pages where possible, for host buffers of at least 2 MiB that need no pinning)."""
    device = torch.device(device)
    pin = pin and device.type == "cpu" and torch.cuda.is_available()
    if device.type == "cpu" and not pin and nbytes >= HUGE_PAGE:
        huge = _huge_page_empty(nbytes)
        if huge is not None:
            return huge
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, device=device, pin_memory=pin)
    skip = (-raw.data_ptr()) % ALIGN
    return raw[skip:skip + nbytes]


def _huge_page_empty(nbytes: int) -> torch.Tensor | None:
    """``nbytes`` of a private anonymous mapping advised to use transparent huge pages, starting
    on a 2 MiB boundary (the tensor keeps the mapping alive); None where that is unavailable."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return None
    try:
        area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(advice)
    except (OSError, ValueError):  # no THP in this kernel, or no memory: ordinary pages
        return None
    whole = torch.frombuffer(area, dtype=torch.uint8)
    skip = (-whole.data_ptr()) % HUGE_PAGE
    return whole[skip:skip + nbytes]


def host_view(buf: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU uint8 tensor, without copying."""
    if buf.device.type != "cpu" or not buf.is_contiguous():
        raise ValueError("host_view needs a contiguous CPU tensor")
    return memoryview(buf.numpy()).cast("B")
