"""Moves one chunk of consecutive FC blocks between a KV cache tensor and the cache file.

A chunk is up to ``max_chunk_blocks`` pairs whose tier ids are consecutive, so its file bytes
form the few large runs of a :class:`~hifc.tiers.layout.ChunkPlan` (one run in the block-record
layout, 2L+1 in the layer-kv layout). Each chunk runs in one I/O worker thread:

swap-out: gather the source blocks into an aligned staging buffer laid out exactly like the file
  (on the GPU for GPU caches: one kernel) -> crc32c of every slice and the block headers, on a
  host copy -> write the runs (kvikio from GPU memory, POSIX from the pinned host copy).
swap-in: read the runs into staging -> verify every header (magic, epoch, block id, owner,
  geometry, header crc) and slice crc on the host copy -> only then scatter into the destination
  blocks. A record that fails verification is never copied into the KV cache.

Checksums are computed where the bytes are on the host anyway (CPU caches, POSIX staging) or on
a pinned host copy filled by a D2H copy on the worker's own CUDA stream; neither the engine
thread nor its compute stream waits for them, and with several workers the checksumming of one
chunk overlaps the I/O of others. Staging buffers and streams are allocated when the tier is built, one set per I/O thread.
"""
from __future__ import annotations

import contextlib
import errno
import queue
import threading

import torch

from hifc.tiers.io_base import FileIO, aligned_empty, host_view
from hifc.tiers.jobs import ShortReadError
from hifc.tiers.layout import HEADER_BYTES, ChunkPlan, Layout
from hifc.tiers.records import pack_header, slice_crcs, verify_header, verify_slices

MAX_RUN_COPIES = 16  # CPU caches: up to this many slice copies per chunk, else one index_select
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class _WorkerBuffers:
    """One worker thread's buffers for KV caches on ``kv_device``.

    ``host`` (aligned, pinned when CUDA is in play) always exists: checksums are computed there.
    ``device`` (aligned, on the GPU) exists for GPU KV caches, so that gathers and scatters are
    GPU kernels and host<->device traffic is one contiguous copy. ``io`` is the buffer the
    backend transfers: ``device`` when the backend reads/writes GPU memory itself (kvikio),
    else ``host``.
    """

    def __init__(self, nbytes: int, kv_device: torch.device, io_device: torch.device):
        self.kv_device = kv_device
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
        """Copy the first ``nbytes`` between staging buffers on the worker stream and wait."""
        if dst.data_ptr() != src.data_ptr():
            with self.context():
                dst[:nbytes].copy_(src[:nbytes], non_blocking=True)
        self.sync()


class ChunkSwapper:
    def __init__(self, layout: Layout, io: FileIO, epoch: int, max_chunk_blocks: int,
                 num_buffers: int, device=None):
        self.layout = layout
        self.io = io
        self.epoch = epoch
        self.max_chunk_blocks = max_chunk_blocks
        self.geometry = layout.geometry
        self._num_buffers = num_buffers
        self._lock = threading.Lock()
        self._pools: dict[torch.device, queue.SimpleQueue] = {}
        if device is not None:  # allocate up front: no page faults or cudaHostAlloc mid-swap
            self._pool(torch.device(device))

    # -- buffers and tensor views ------------------------------------------------------------
    def _pool(self, kv_device: torch.device) -> queue.SimpleQueue:
        kv_device = torch.device(kv_device)
        if kv_device.type == "cuda" and kv_device.index is None:  # "cuda" means the current one
            kv_device = torch.device("cuda", torch.cuda.current_device())
        with self._lock:
            pool = self._pools.get(kv_device)
            if pool is None:
                pool = self._pools[kv_device] = queue.SimpleQueue()
                nbytes = self.layout.staging_bytes(self.max_chunk_blocks)
                io_device = self.io.staging_device(kv_device)
                for _ in range(self._num_buffers):
                    pool.put(_WorkerBuffers(nbytes, kv_device, io_device))
            return pool

    @contextlib.contextmanager
    def _buffers(self, kv_device: torch.device):
        """Borrow one set of staging buffers (one per I/O thread, so never a wait)."""
        pool = self._pool(kv_device)
        buffers = pool.get()
        try:
            yield buffers
        finally:
            pool.put(buffers)

    def release(self) -> None:
        with self._lock:
            self._pools.clear()

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
    def _runs(ids: list[int]) -> list[tuple[int, int, int]]:
        """(first id, position, length) of each run of consecutive ids."""
        runs: list[tuple[int, int, int]] = []
        for pos, block in enumerate(ids):
            if runs and block == runs[-1][0] + runs[-1][2]:
                first, at, length = runs[-1]
                runs[-1] = (first, at, length + 1)
            else:
                runs.append((block, pos, 1))
        return runs

    def _gather(self, kv: torch.Tensor, ids: list[int], out: torch.Tensor) -> None:
        """``out[:, :, i] = kv[:, :, ids[i]]``: runs of ids as slices, else one index kernel."""
        runs = self._runs(ids)
        if (kv.is_cuda and len(runs) > 1) or len(runs) > MAX_RUN_COPIES:
            index = torch.tensor(ids, dtype=torch.long, device=kv.device)
            out.copy_(kv.index_select(2, index), non_blocking=True)
            return
        for first, at, length in runs:
            out.narrow(2, at, length).copy_(kv.narrow(2, first, length), non_blocking=True)

    def _scatter(self, kv: torch.Tensor, ids: list[int], data: torch.Tensor) -> None:
        """``kv[:, :, ids[i]] = data[:, :, i]``."""
        runs = self._runs(ids)
        if (kv.is_cuda and len(runs) > 1) or len(runs) > MAX_RUN_COPIES:
            index = torch.tensor(ids, dtype=torch.long, device=kv.device)
            kv.index_copy_(2, index, data)
            return
        for first, at, length in runs:
            kv.narrow(2, first, length).copy_(data.narrow(2, at, length), non_blocking=True)

    # -- swap-out ----------------------------------------------------------------------------
    def swap_out(self, kv: torch.Tensor, src_ids: list[int], first_block: int, owner,
                 ready: torch.cuda.Event | None) -> int:
        plan = self.layout.chunk_plan(first_block, len(src_ids))
        with self._buffers(kv.device) as buffers:
            self._swap_out(kv, src_ids, first_block, owner, ready, plan, buffers)
        return plan.n * self.geometry.block_bytes

    def _swap_out(self, kv, src_ids, first_block, owner, ready, plan, buffers) -> None:
        nbytes = plan.staging_bytes
        with buffers.context():
            if ready is not None:
                buffers.stream.wait_event(ready)
            self._gather(kv, src_ids, self._data_view(buffers.work[:nbytes], plan))
        buffers.copy(buffers.host, buffers.work, nbytes)  # D2H for GPU caches, else a no-op
        host = host_view(buffers.host[:nbytes])
        for i in range(plan.n):
            crcs = slice_crcs(host, self._slice_offsets(plan, i), self.geometry.slice_bytes)
            at = plan.header_offset + i * plan.header_stride
            pack_header(host[at:at + HEADER_BYTES], epoch=self.epoch, block_id=first_block + i,
                        owner=owner, slice_bytes=self.geometry.slice_bytes, crcs=crcs)
        if buffers.io is not buffers.host:  # headers were built on the host: upload them
            with buffers.context():
                self._header_view(buffers.io, plan).copy_(
                    self._header_view(buffers.host, plan), non_blocking=True)
            buffers.sync()
        for file_offset, offset, length in plan.runs:
            written = self.io.write(buffers.io[offset:offset + length], file_offset)
            if written != length:
                raise OSError(errno.EIO, f"short write: {written} of {length} bytes at "
                              f"offset {file_offset}")

    # -- swap-in -----------------------------------------------------------------------------
    def swap_in(self, kv: torch.Tensor, first_block: int, dst_ids: list[int], owner,
                ready: torch.cuda.Event | None) -> int:
        plan = self.layout.chunk_plan(first_block, len(dst_ids))
        with self._buffers(kv.device) as buffers:
            self._swap_in(kv, first_block, dst_ids, owner, ready, plan, buffers)
        return plan.n * self.geometry.block_bytes

    def _swap_in(self, kv, first_block, dst_ids, owner, ready, plan, buffers) -> None:
        nbytes = plan.staging_bytes
        for file_offset, offset, length in plan.runs:
            got = self.io.read(buffers.io[offset:offset + length], file_offset)
            if got != length:
                raise ShortReadError(errno.EIO, f"short read: {got} of {length} bytes at "
                                     f"offset {file_offset}")
        buffers.copy(buffers.host, buffers.io, nbytes)  # D2H when kvikio read into the GPU
        host = host_view(buffers.host[:nbytes])
        g = self.geometry
        for i in range(plan.n):
            at = plan.header_offset + i * plan.header_stride
            stored = verify_header(host[at:at + HEADER_BYTES], epoch=self.epoch,
                                   block_id=first_block + i, owner=owner,
                                   num_slices=g.num_slices, slice_bytes=g.slice_bytes)
            computed = slice_crcs(host, self._slice_offsets(plan, i), g.slice_bytes)
            verify_slices(first_block + i, stored, computed, g.num_layers)
        # Verified: only now may the bytes reach the KV cache.
        buffers.copy(buffers.work, buffers.io, nbytes)  # H2D when posix read into the host
        with buffers.context():
            if ready is not None:
                buffers.stream.wait_event(ready)
            self._scatter(kv, dst_ids, self._data_view(buffers.work[:nbytes], plan))
        buffers.sync()
