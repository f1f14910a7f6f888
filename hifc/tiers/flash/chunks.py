"""Describes the work on one chunk of consecutive FC blocks as pipeline stages.

A chunk is up to ``max_chunk_blocks`` pairs whose tier ids are consecutive, so its file bytes
form the few large runs of a :class:`~hifc.tiers.flash.layout.ChunkPlan` (one run in the block-record
layout, 2L+1 in the layer-kv layout). :meth:`ChunkMover.swap_out` and :meth:`swap_in` return a
:class:`~hifc.tiers.flash.pipeline.ChunkTask` whose stages :mod:`hifc.tiers.flash.pipeline` runs, CPU stages
and I/O stages on separate threads, on one host staging set (and, for GPU caches, a work buffer
on the GPU borrowed for the gather or the scatter only):

swap-out: (WORK, GPU caches) gather the source blocks into a work buffer laid out exactly like
  the file (one kernel) and copy it to the host set; (CPU) crc32c of every slice and the block
  headers, in place on the host set (CPU caches: gathered into the host set with the checksums
  computed in cache, one stage) -> (IO) write the runs (kvikio from GPU memory, POSIX from the
  host set). The blocks are staged, and ``on_staged`` called, once the copy to the host ends.
swap-in: (IO) read the runs into staging -> (WORK, or CPU for CPU caches) verify every header
  (magic, kind, block id, geometry, header crc, and epoch + owner or salt + hash) and slice crc
  on the host set -> only then scatter the blocks that passed into their destination blocks. A
  record that fails verification is never copied into the KV cache; the chunk then fails with
  the first error. A prefix record whose header passed and whose payload did not gets its
  header page zeroed on the file, so that no later run indexes it again.

What a record's header holds is a stamp (:mod:`hifc.tiers.flash.records`): ``SwapStamp`` for a
preempted sequence's blocks (``swap_out``/``swap_in``), ``PrefixStamp`` for prefix-store blocks
(``write``/``read`` with callbacks that report, per block, what was written or delivered). Every
record written gets the next log sequence number (``next_lsn``), in submission order.

Checksums are computed where the bytes are on the host anyway (CPU caches, POSIX staging) or on
a pinned host copy filled by a D2H copy on the work buffer's own CUDA stream; neither the engine
thread nor its compute stream waits for them. Staging memory and streams are allocated when the
tier is built: ``num_buffers`` host sets and ``num_work_buffers`` work buffers
(:mod:`hifc.tiers.flash.staging`).
"""
from __future__ import annotations

import errno
import functools
import threading
from typing import Callable

import torch

from hifc.tiers.flash.hostcopy import gather_with_crcs, int_view, verify_then_scatter
from hifc.tiers.flash.io_base import FileIO, IOPriority, aligned_empty, host_view
from hifc.tiers.geometry import runs_of
from hifc.tiers.jobs import IntegrityError, ShortReadError
from hifc.dtypes import copy_dtype
from hifc.tiers.flash.layout import HEADER_BYTES, ChunkPlan, Layout
from hifc.tiers.flash.pipeline import CPU, IO, WORK, ChunkTask
from hifc.tiers.flash.records import PrefixStamp, SwapStamp, slice_crcs, verify_slices
from hifc.tiers.flash.staging import Staging, StagingBuffers, WorkBuffer, build_staging

Stamp = SwapStamp | PrefixStamp


class ChunkMover:
    """``num_buffers`` host staging sets and ``num_work_buffers`` work buffers per KV cache
    device (:func:`~hifc.tiers.flash.staging.build_staging`; ``work_buffers`` None: for GPU
    caches only, True: CPU caches too, which runs the GPU caches' path on CPU tensors)."""

    def __init__(self, layout: Layout, io: FileIO, epoch: int, max_chunk_blocks: int,
                 num_buffers: int, device=None, first_lsn: int = 1, num_work_buffers: int = 1,
                 work_buffers: bool | None = None):
        self.layout = layout
        self.io = io
        self.epoch = epoch
        self.next_lsn = first_lsn  # of the next record written (tasks are built in order)
        self.max_chunk_blocks = max_chunk_blocks
        self.geometry = layout.geometry
        self._num_buffers = num_buffers
        self._num_work_buffers = num_work_buffers
        self._work_buffers = work_buffers
        self._lock = threading.Lock()
        self._staging: dict[torch.device, Staging] = {}
        if device is not None:  # allocate up front: no page faults or cudaHostAlloc mid-swap
            self.staging(torch.device(device))

    # -- buffers and tensor views ------------------------------------------------------------
    def staging(self, kv_device: torch.device) -> Staging:
        """The staging for KV caches on ``kv_device`` (built on first use)."""
        kv_device = torch.device(kv_device)
        if kv_device.type == "cuda" and kv_device.index is None:  # "cuda" means the current one
            kv_device = torch.device("cuda", torch.cuda.current_device())
        with self._lock:
            staging = self._staging.get(kv_device)
            if staging is None:
                staging = self._staging[kv_device] = build_staging(
                    kv_device, self.io.staging_device(kv_device),
                    self.layout.staging_bytes(self.max_chunk_blocks), self._num_buffers,
                    self._num_work_buffers, self._work_buffers)
            return staging

    def staging_memory(self) -> dict:
        """Bytes of host staging and of work buffers (next to the KV cache), all devices."""
        with self._lock:
            built = list(self._staging.values())
        return {"staging_sets": sum(s.sets.size for s in built),
                "staging_host_bytes": sum(s.host_bytes for s in built),
                "staging_work_bytes": sum(s.work_bytes for s in built)}

    def release(self) -> None:
        with self._lock:
            self._staging.clear()

    def _data_view(self, staging: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
        """Staging bytes viewed as ``[L, 2, n, block_size, kv_heads, head_dim]`` of the
        geometry's ``copy_dtype`` (the dtype of the tier's ``copy_view`` of the KV cache)."""
        g = self.geometry
        typed = staging.view(copy_dtype(g.dtype))
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

    def _gather(self, kv: torch.Tensor, ids: list[int], out: torch.Tensor) -> None:
        """GPU caches: ``out[:, :, i] = kv[:, :, ids[i]]``: one run as a slice copy, else one
        index kernel."""
        runs = runs_of(ids)
        if len(runs) > 1:
            index = torch.tensor(ids, dtype=torch.long, device=kv.device)
            out.copy_(kv.index_select(2, index), non_blocking=True)
            return
        for first, at, length in runs:
            out.narrow(2, at, length).copy_(kv.narrow(2, first, length), non_blocking=True)

    def _scatter(self, kv: torch.Tensor, ids: list[int], data: torch.Tensor) -> None:
        """GPU caches: ``kv[:, :, ids[i]] = data[:, :, i]``."""
        runs = runs_of(ids)
        if len(runs) > 1:
            index = torch.tensor(ids, dtype=torch.long, device=kv.device)
            kv.index_copy_(2, index, data)
            return
        for first, at, length in runs:
            kv.narrow(2, first, length).copy_(data.narrow(2, at, length), non_blocking=True)

    def prefix_stamp(self, salt: bytes, hashes) -> PrefixStamp:
        return PrefixStamp(self.epoch, salt, tuple(hashes))

    # -- writes ------------------------------------------------------------------------------
    def swap_out(self, kv: torch.Tensor, src_ids: list[int], first_block: int, owner,
                 ready: torch.cuda.Event | None,
                 on_staged: Callable[[], None] | None = None) -> ChunkTask:
        return self.write(kv, src_ids, first_block, SwapStamp(self.epoch, tuple(owner)), ready,
                          on_staged=on_staged)

    def write(self, kv: torch.Tensor, src_ids: list[int], first_block: int, stamp: Stamp,
              ready: torch.cuda.Event | None,
              on_written: Callable[[], None] | None = None,
              priority: IOPriority = IOPriority.SWAP_OUT,
              on_staged: Callable[[], None] | None = None) -> ChunkTask:
        """Blocks ``kv[:, :, src_ids]`` as records at tier blocks ``first_block...``;
        ``on_staged()`` (a worker thread) once their bytes are all copied out of ``kv`` into
        staging (``kv``'s blocks may change from then on), ``on_written()`` once they are all
        on the file. ``priority``: who waits for the write (a shared device's arbiter admits
        it in that order)."""
        plan = self.layout.chunk_plan(first_block, len(src_ids))
        first_lsn, self.next_lsn = self.next_lsn, self.next_lsn + plan.n
        staging = self.staging(kv.device)
        seal = functools.partial(self._seal, first_block, stamp, first_lsn, plan)

        def write(buffers: StagingBuffers) -> None:
            self._write(plan, buffers, priority)
            if on_written is not None:
                on_written()

        if staging.uses_work:  # gather next to the cache, one copy to the host, then seal
            gather = functools.partial(self._gather_out, kv, src_ids, ready, plan, on_staged)
            stages = ((WORK, gather), (CPU, seal), (IO, write))
        else:  # copy and checksum layer by layer, in cache (hostcopy), then seal
            stage = functools.partial(self._stage_on_host, kv, src_ids, plan, on_staged, seal)
            stages = ((CPU, stage), (IO, write))
        return ChunkTask(staging.sets, stages, plan.n * self.geometry.block_bytes,
                         staging.work)

    def _stage_on_host(self, kv, src_ids, plan, on_staged: Callable[[], None] | None, seal,
                       buffers: StagingBuffers) -> None:
        """CPU caches: blocks into the host set with their slices' crc32c, then sealed."""
        nbytes = plan.staging_bytes
        data = int_view(self._data_view(buffers.host[:nbytes], plan))
        crcs = gather_with_crcs(int_view(kv), src_ids, data, host_view(buffers.host[:nbytes]),
                                plan, self.geometry.slice_bytes)
        if on_staged is not None:
            on_staged()
        seal(buffers, crcs)

    def _gather_out(self, kv, src_ids, ready, plan, on_staged: Callable[[], None] | None,
                    buffers: StagingBuffers, work: WorkBuffer) -> None:
        """Blocks gathered into ``work`` (one kernel), copied to the host set; ``on_staged()``
        once that copy has ended (the KV cache's blocks are free to change from then on)."""
        nbytes = plan.staging_bytes
        with work.context():
            work.wait(ready)
            self._gather(kv, src_ids, self._data_view(work.data[:nbytes], plan))
        work.copy(buffers.host, work.data, nbytes)  # D2H, then the stream is synced
        if on_staged is not None:
            on_staged()

    def _seal(self, first_block: int, stamp: Stamp, first_lsn: int, plan: ChunkPlan,
              buffers: StagingBuffers, crcs: list[list[int]] | None = None) -> None:
        """Headers on the host set, with the slices' crc32c (computed here unless given)."""
        g = self.geometry
        host = host_view(buffers.host[:plan.staging_bytes])
        if crcs is None:
            crcs = [slice_crcs(host, self._slice_offsets(plan, i), g.slice_bytes)
                    for i in range(plan.n)]
        for i in range(plan.n):
            at = plan.header_offset + i * plan.header_stride
            stamp.pack(host[at:at + HEADER_BYTES], i, first_block + i, first_lsn + i,
                       g.slice_bytes, crcs[i])
        if buffers.gpu is not None:  # the backend writes the GPU copy: upload the headers
            with buffers.gpu.context():
                self._header_view(buffers.io, plan).copy_(
                    self._header_view(buffers.host, plan), non_blocking=True)
            buffers.gpu.sync()

    def _write(self, plan: ChunkPlan, buffers: StagingBuffers, priority: IOPriority) -> None:
        for file_offset, offset, length in plan.runs:
            written = self.io.write(buffers.io[offset:offset + length], file_offset, priority)
            if written != length:
                raise OSError(errno.EIO, f"short write: {written} of {length} bytes at "
                              f"offset {file_offset}")

    # -- reads -------------------------------------------------------------------------------
    def swap_in(self, kv: torch.Tensor, first_block: int, dst_ids: list[int], owner,
                ready: torch.cuda.Event | None) -> ChunkTask:
        return self.read(kv, first_block, dst_ids, SwapStamp(self.epoch, tuple(owner)), ready)

    def read(self, kv: torch.Tensor, first_block: int, dst_ids: list[int], stamp: Stamp,
             ready: torch.cuda.Event | None,
             on_delivered: Callable[[int], None] | None = None) -> ChunkTask:
        """Records at tier blocks ``first_block...`` into ``kv[:, :, dst_ids]``, each verified
        against ``stamp`` first; ``on_delivered(i)`` (a worker thread) for each block ``i`` of
        the chunk that passed and reached the KV cache."""
        plan = self.layout.chunk_plan(first_block, len(dst_ids))
        finish = functools.partial(self._finish_in, kv, first_block, dst_ids, stamp, ready, plan,
                                   on_delivered)
        staging = self.staging(kv.device)
        return ChunkTask(staging.sets, ((IO, functools.partial(self._read, plan)),
                                        (WORK if staging.uses_work else CPU, finish)),
                         plan.n * self.geometry.block_bytes, staging.work)

    def _read(self, plan: ChunkPlan, buffers: StagingBuffers) -> None:
        for file_offset, offset, length in plan.runs:
            got = self.io.read(buffers.io[offset:offset + length], file_offset,
                               IOPriority.SWAP_IN)
            if got != length:
                raise ShortReadError(errno.EIO, f"short read: {got} of {length} bytes at "
                                     f"offset {file_offset}")

    def _finish_in(self, kv, first_block, dst_ids, stamp: Stamp, ready, plan, on_delivered,
                   buffers: StagingBuffers, work: WorkBuffer | None = None) -> None:
        """Verify every block on the host set, then scatter those that passed: through
        ``work`` (next to the KV cache) where given, else straight from the host set."""
        nbytes = plan.staging_bytes
        if buffers.gpu is not None:  # D2H: kvikio read into the set's GPU buffer
            buffers.gpu.copy(buffers.host, buffers.io, nbytes)
        host = host_view(buffers.host[:nbytes])
        g = self.geometry
        rejected: list[IntegrityError] = []
        torn: list[int] = []  # tier blocks whose header passed and whose payload did not

        def verify(i: int) -> bool:
            at = plan.header_offset + i * plan.header_stride
            try:
                stored = stamp.verify(host[at:at + HEADER_BYTES], i, first_block + i,
                                      g.num_slices, g.slice_bytes)
            except IntegrityError as exc:
                rejected.append(exc)
                return False
            try:
                computed = slice_crcs(host, self._slice_offsets(plan, i), g.slice_bytes)
                verify_slices(first_block + i, stored, computed, g.num_layers)
            except IntegrityError as exc:
                rejected.append(exc)
                torn.append(first_block + i)
                return False
            return True

        if work is None:  # each block verified, then copied while cached (hostcopy)
            data = int_view(self._data_view(buffers.host[:nbytes], plan))
            delivered = verify_then_scatter(int_view(kv), dst_ids, data, verify)
        else:
            delivered = [i for i in range(plan.n) if verify(i)]
            if delivered:  # verified: only now may the bytes reach the KV cache
                self._scatter_verified(kv, dst_ids, delivered, ready, plan, buffers, work)
        if on_delivered is not None:
            for i in delivered:
                on_delivered(i)
        if torn and isinstance(stamp, PrefixStamp):
            self._invalidate(torn)
        if rejected:
            raise rejected[0]

    def _invalidate(self, blocks: list[int]) -> None:
        """Zero the header pages of prefix records whose payload failed its crcs, so that the
        scan of a later run does not index them again (the header alone looks valid). The
        records are pinned by the read that found them: nothing else writes those blocks now.
        Best effort: where the write fails, the record is still dropped from this run's index
        and a later run's read rejects it again."""
        page = aligned_empty(HEADER_BYTES, torch.device("cpu"))
        page.zero_()
        for block in blocks:
            try:
                self.io.write(page, self.layout.header_file_offset(block),
                              IOPriority.PREFIX_WRITE)
            except OSError:
                pass

    def _scatter_verified(self, kv, dst_ids, delivered: list[int], ready, plan,
                          buffers: StagingBuffers, work: WorkBuffer) -> None:
        """``kv[:, :, dst_ids[i]] = block i`` for each verified ``i``, through ``work``."""
        work.copy(work.data, buffers.io, plan.staging_bytes)  # H2D unless kvikio read into it
        with work.context():
            work.wait(ready)
            data = self._data_view(work.data[:plan.staging_bytes], plan)
            if len(delivered) < plan.n:
                index = torch.tensor(delivered, dtype=torch.long, device=data.device)
                data = data.index_select(2, index)
            self._scatter(kv, [dst_ids[i] for i in delivered], data)
        work.sync()
