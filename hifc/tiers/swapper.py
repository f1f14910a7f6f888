"""Moves one chunk of consecutive FC blocks between a KV cache tensor and the cache file.

A chunk is up to ``max_chunk_blocks`` pairs whose tier ids are consecutive, so its file bytes
form the few large runs of a :class:`~hifc.tiers.layout.ChunkPlan` (one run in the block-record
layout, 2L+1 in the layer-kv layout). Each chunk runs in one I/O worker thread:

swap-out: gather the source blocks into an aligned staging buffer laid out exactly like the file
  (one tensor copy, on the KV cache's device for kvikio) -> crc32c of every slice and the block
  headers -> write the runs.
swap-in: read the runs into staging -> verify every header (magic, epoch, block id, owner,
  geometry, header crc) and slice crc -> only then scatter into the destination blocks. A record
  that fails is never copied into the KV cache.

When staging lives on the GPU the checksums are computed on a pinned host mirror filled by a D2H
copy on the worker's own CUDA stream, so neither the engine thread nor its compute stream waits
for verification; with many workers, checksumming of one chunk overlaps the I/O of others.
Staging buffers and streams are per worker thread and reused.
"""
from __future__ import annotations

import contextlib
import errno
import threading

import torch

from hifc.tiers.io_base import FileIO, aligned_empty, host_view
from hifc.tiers.jobs import ShortReadError
from hifc.tiers.layout import HEADER_BYTES, ChunkPlan, Layout
from hifc.tiers.records import pack_header, slice_crcs, verify_header, verify_slices

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class _WorkerBuffers:
    def __init__(self, nbytes: int, staging_device: torch.device, kv_device: torch.device):
        on_gpu = staging_device.type == "cuda"
        self.kv_device = kv_device
        self.staging = aligned_empty(nbytes, staging_device, pin=kv_device.type == "cuda")
        self.mirror = aligned_empty(nbytes, torch.device("cpu"), pin=True) if on_gpu else None
        cuda_dev = staging_device if on_gpu else kv_device
        self.stream = torch.cuda.Stream(cuda_dev) if cuda_dev.type == "cuda" else None

    def context(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else \
            contextlib.nullcontext()

    def sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def host_bytes(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` of staging as host memory (D2H into the mirror if needed)."""
        if self.mirror is None:
            self.sync()
            return host_view(self.staging[:nbytes])
        with self.context():
            self.mirror[:nbytes].copy_(self.staging[:nbytes], non_blocking=True)
        self.sync()
        return host_view(self.mirror[:nbytes])


class ChunkSwapper:
    def __init__(self, layout: Layout, io: FileIO, epoch: int, max_chunk_blocks: int):
        self.layout = layout
        self.io = io
        self.epoch = epoch
        self.max_chunk_blocks = max_chunk_blocks
        self.geometry = layout.geometry
        self._local = threading.local()

    # -- per-thread buffers and tensor views -------------------------------------------------
    def _buffers(self, kv_device: torch.device) -> _WorkerBuffers:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None or buffers.kv_device != kv_device:
            nbytes = self.layout.staging_bytes(self.max_chunk_blocks)
            buffers = _WorkerBuffers(nbytes, self.io.staging_device(kv_device), kv_device)
            self._local.buffers = buffers
        return buffers

    def _data_view(self, staging: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
        """Staging bytes viewed as ``[L, 2, n, block_size, kv_heads, head_dim]``."""
        g = self.geometry
        typed = staging.view(TORCH_DTYPES[g.dtype])
        it = g.itemsize
        s_l, s_k, s_n = (s // it for s in plan.data_strides)
        size = (g.num_layers, 2, plan.n, g.block_size, g.num_kv_heads, g.head_dim)
        stride = (s_l, s_k, s_n, g.num_kv_heads * g.head_dim, g.head_dim, 1)
        return typed.as_strided(size, stride, typed.storage_offset() + plan.data_offset // it)

    def _header_view(self, buf: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
        return buf.as_strided((plan.n, HEADER_BYTES), (plan.header_stride, 1),
                              buf.storage_offset() + plan.header_offset)

    def _slice_offsets(self, plan: ChunkPlan, i: int) -> list[int]:
        return [plan.slice_offset(i, layer, kind)
                for layer in range(self.geometry.num_layers) for kind in (0, 1)]

    @staticmethod
    def _blocks(kv: torch.Tensor, ids: list[int]):
        """``kv[:, :, ids]`` as a view when ids are consecutive, else an index tensor."""
        if ids == list(range(ids[0], ids[0] + len(ids))):
            return kv.narrow(2, ids[0], len(ids)), None
        return None, torch.tensor(ids, dtype=torch.long, device=kv.device)

    # -- swap-out ----------------------------------------------------------------------------
    def swap_out(self, kv: torch.Tensor, src_ids: list[int], first_block: int, owner,
                 ready: torch.cuda.Event | None) -> int:
        plan = self.layout.chunk_plan(first_block, len(src_ids))
        buffers = self._buffers(kv.device)
        staging = buffers.staging[:plan.staging_bytes]
        with buffers.context():
            if ready is not None:
                buffers.stream.wait_event(ready)
            view, index = self._blocks(kv, src_ids)
            if view is None:
                view = kv.index_select(2, index)
            self._data_view(staging, plan).copy_(view, non_blocking=True)
        host = buffers.host_bytes(plan.staging_bytes)
        for i in range(plan.n):
            crcs = slice_crcs(host, self._slice_offsets(plan, i), self.geometry.slice_bytes)
            at = plan.header_offset + i * plan.header_stride
            pack_header(host[at:at + HEADER_BYTES], epoch=self.epoch, block_id=first_block + i,
                        owner=owner, slice_bytes=self.geometry.slice_bytes, crcs=crcs)
        if buffers.mirror is not None:  # headers were built in the host mirror: upload them
            with buffers.context():
                self._header_view(staging, plan).copy_(
                    self._header_view(buffers.mirror, plan), non_blocking=True)
            buffers.sync()
        for file_offset, offset, length in plan.runs:
            written = self.io.write(staging[offset:offset + length], file_offset)
            if written != length:
                raise OSError(errno.EIO, f"short write: {written} of {length} bytes at "
                              f"offset {file_offset}")
        return plan.n * self.geometry.block_bytes

    # -- swap-in -----------------------------------------------------------------------------
    def swap_in(self, kv: torch.Tensor, first_block: int, dst_ids: list[int], owner,
                ready: torch.cuda.Event | None) -> int:
        plan = self.layout.chunk_plan(first_block, len(dst_ids))
        buffers = self._buffers(kv.device)
        staging = buffers.staging[:plan.staging_bytes]
        for file_offset, offset, length in plan.runs:
            got = self.io.read(staging[offset:offset + length], file_offset)
            if got != length:
                raise ShortReadError(errno.EIO, f"short read: {got} of {length} bytes at "
                                     f"offset {file_offset}")
        host = buffers.host_bytes(plan.staging_bytes)
        g = self.geometry
        for i in range(plan.n):
            at = plan.header_offset + i * plan.header_stride
            stored = verify_header(host[at:at + HEADER_BYTES], epoch=self.epoch,
                                   block_id=first_block + i, owner=owner,
                                   num_slices=g.num_slices, slice_bytes=g.slice_bytes)
            computed = slice_crcs(host, self._slice_offsets(plan, i), g.slice_bytes)
            verify_slices(first_block + i, stored, computed, g.num_layers)
        with buffers.context():
            if ready is not None:
                buffers.stream.wait_event(ready)
            data = self._data_view(staging, plan)
            if data.device != kv.device:
                data = data.to(kv.device, non_blocking=True)
            view, index = self._blocks(kv, dst_ids)
            if view is not None:
                view.copy_(data, non_blocking=True)
            else:
                kv.index_copy_(2, index, data)
        buffers.sync()
        return plan.n * g.block_bytes
