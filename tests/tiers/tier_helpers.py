"""Helpers shared by the tier tests (import as ``tests.tiers.tier_helpers``)."""
from __future__ import annotations

import os
import threading

import torch

from hifc.dtypes import torch_dtype
from hifc.tiers import KVGeometry
from hifc.tiers.flash.chunks import ChunkMover
from hifc.tiers.flash.io_base import FileIO, IOPriority


def random_kv(geometry: KVGeometry, num_blocks: int, device="cpu", seed: int = 0) -> torch.Tensor:
    """A KV cache ``[L, 2, num_blocks, block_size, kv_heads, head_dim]`` of random values."""
    gen = torch.Generator().manual_seed(seed)
    shape = (geometry.num_layers, 2, num_blocks, geometry.block_size, geometry.num_kv_heads,
             geometry.head_dim)
    return torch.randn(shape, generator=gen).to(torch_dtype(geometry.dtype)).to(device)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit equal (NaNs and signed zeros included)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def flip_byte(path, offset: int, mask: int = 0x20) -> None:
    """XOR the byte at ``offset`` of the file with ``mask``, as a media error would."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([old[0] ^ mask]), offset)
    finally:
        os.close(fd)


SMALL = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=32, block_size=16, dtype="float16")
# SMALL's shape in float8, as if quantised with scales of this digest
SMALL_FP8 = KVGeometry(2, 2, 32, 16, "float8_e4m3fn", scale_digest="5ca1e" * 6 + "00")


class GatedIO(FileIO):
    """Holds every I/O until the test opens the gate."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.name, self.direct = inner, "gated", inner.direct
        self.gate = threading.Event()
        self.arrived = threading.Event()  # an I/O is waiting at the gate (or went through)

    def staging_device(self, kv_device):
        return self.inner.staging_device(kv_device)

    def write(self, buf, file_offset, priority=IOPriority.SWAP_OUT):
        self.arrived.set()
        assert self.gate.wait(10)
        return self.inner.write(buf, file_offset, priority)

    def read(self, buf, file_offset, priority=IOPriority.SWAP_IN):
        self.arrived.set()
        assert self.gate.wait(10)
        return self.inner.read(buf, file_offset, priority)


def gated(tier, chunk_blocks: int = 8, num_buffers: int = 2, num_work_buffers: int = 1,
          work_buffers: bool | None = None) -> GatedIO:
    """Route a flash tier's I/O through a closed gate (returned: ``gate.set()`` opens it), with
    ``num_buffers`` host staging sets and ``num_work_buffers`` work buffers (``work_buffers``
    True: CPU caches too, the GPU caches' path on CPU tensors)."""
    io = GatedIO(tier.io)
    tier.mover.chunks = ChunkMover(tier.layout, io, tier.epoch, chunk_blocks,
                                   num_buffers=num_buffers, first_lsn=tier.mover.chunks.next_lsn,
                                   num_work_buffers=num_work_buffers, work_buffers=work_buffers)
    return io
