"""``FlashTier``: KV blocks swapped to a preallocated cache file on an SSD.

Wires together the cache file (superblock, epoch), the layout, an I/O backend (kvikio for GPU KV
caches where GPUDirect Storage works, else POSIX O_DIRECT; see ``resolve_backend``), optional
fault injection, the device's arbiter when other engine replicas share the device
(:mod:`hifc.tiers.flash.arbiter`), and the chunk mover. A swap's pairs are cut, in the order given, into chunks of
consecutive tier ids (adjacent blocks coalesced into large I/Os, at most ``flash_chunk_mib``
each); every chunk runs through the two-stage pipeline of :mod:`hifc.tiers.flash.pipeline` (its
I/O on the tier's ``flash_io_threads`` threads, its gather, checksums and scatter on
``flash_prep_threads`` others), so a job is a batch of chunk futures whose completion ``poll``
checks. Staging memory: one chunk buffer set per I/O thread and per prep thread.

A swap-out reports each chunk's pairs staged (``take_staged``) once they are gathered into its
staging buffers: the engine reuses those GPU blocks while the chunk's write goes on, the
buffers holding the only copy until it ends. As staging is bounded, a swap-out larger than it
stages, and so frees, chunk by chunk as earlier writes give their buffer sets back. Freeing only
once the whole swap-out is staged would hold every block of a large one until all but its last
few chunks are on disk: nearly as long as the write itself.

The same log holds the prefix store (:mod:`hifc.tiers.flash.prefix_store`): ``lookup_prefix``,
``submit_prefix_write`` and ``submit_prefix_read`` keep full KV blocks by content hash, across
restarts (a reopened file's index is rebuilt from its record headers,
:mod:`hifc.tiers.flash.scan`). Reservations go through the prefix index
(:mod:`hifc.tiers.flash.prefix_index`), which overwrites prefix records as the log comes round.
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import os
from contextlib import AbstractContextManager, nullcontext

import torch

from hifc.tiers.config import FLASH_BACKENDS, TierConfig
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.flash.cache_file import CacheFile
from hifc.tiers.flash.chunks import ChunkMover
from hifc.tiers.flash.faults import FaultInjector, FaultyIO
from hifc.tiers.flash.io_base import FileIO, IOPriority
from hifc.tiers.flash.kvikio_io import KvikioIO, gds_available, kvikio_available
from hifc.tiers.flash.layout import make_layout
from hifc.tiers.flash.pipeline import ChunkPipeline, cpu_stage_pool
from hifc.tiers.flash.posix_io import PosixIO, open_data_fd
from hifc.tiers.flash.prefix_index import PrefixIndex
from hifc.tiers.flash.prefix_store import (
    PREFIX_READ, PREFIX_WRITE, WRITE_LIMIT_CHUNKS, PrefixStore, check_key, check_read_pairs,
    check_write_pairs, mark_delivered, mark_written,
)
from hifc.tiers.flash.scan import ScanResult, scan_headers
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.jobs import PrefixJob, classify
from hifc.tiers.tier import SWAP_OUT, KVTier, copy_view, ready_event

def resolve_backend(backend: str, device) -> str:
    """``auto``: kvikio for GPU caches where GPUDirect Storage works, else POSIX O_DIRECT.

    Without GDS, kvikio (compat mode) does the same POSIX I/O through its own bounce buffers
    into GPU staging, which then goes back to the host for the checksums: two copies more than
    POSIX into pinned host staging. On the H200 VM (no nvidia-fs) `hifc bench io` measured
    sequential reads at 0.91 of raw through kvikio and 0.97 through POSIX (docs/RESULTS.md)."""
    if backend not in FLASH_BACKENDS:
        raise ValueError(f"unknown I/O backend {backend!r}; choose one of {list(FLASH_BACKENDS)}")
    if backend == "auto":
        on_gpu = torch.device(device).type == "cuda"
        return "kvikio" if on_gpu and gds_available() else "posix"
    if backend == "kvikio" and not kvikio_available():
        raise ValueError("backend 'kvikio' needs the kvikio package and a CUDA device")
    return backend


MAX_DEFAULT_PREP_THREADS = 4


def default_prep_threads(io_threads: int) -> int:
    """CPU-stage threads when not given: min(io_threads, cores, 4). One thread gathers and
    checksums 4-7 GiB/s (CPU machine), so 4 feed even a fast NVMe; each thread adds one staging
    buffer set (on the GPU too, for GPU caches). See docs/RESULTS.md, "Flash tier I/O (issue 3)"."""
    return max(1, min(io_threads, os.cpu_count() or 1, MAX_DEFAULT_PREP_THREADS))


RAMP_DIVISOR = 4  # a job's first and last chunk hold at most max_blocks // 4 blocks (>= 1)


def split_chunks(pairs: list[tuple[int, int]], tier_index: int, max_blocks: int):
    """Cut pairs, in order, into runs whose tier ids are consecutive (at most max_blocks).

    The job's first and last chunks are cut shorter (``max_blocks // RAMP_DIVISOR``): the first
    swap-out write can only start once its chunk is gathered and checksummed, and a swap-in is
    only done once its last chunk is verified and scattered, so small end chunks shorten the
    pipeline's fill and drain (the CPU work that no I/O overlaps)."""
    ramp = max(1, max_blocks // RAMP_DIVISOR)
    chunks: list[list[tuple[int, int]]] = []
    for pair in pairs:
        last = chunks[-1] if chunks else None
        limit = ramp if len(chunks) == 1 else max_blocks
        if (last is not None and len(last) < limit
                and pair[tier_index] == last[-1][tier_index] + 1):
            last.append(pair)
        else:
            chunks.append([pair])
    if len(chunks) > 1 and len(chunks[-1]) > ramp:
        tail = chunks.pop()
        chunks += [tail[:-ramp], tail[-ramp:]]
    return chunks


class FlashTier(KVTier):
    kind = "flash"

    def __init__(self, geometry: KVGeometry, num_blocks: int, config: TierConfig, *,
                 device="cpu", device_share: DeviceShare | None = None):
        io_threads = config.flash_io_threads
        prep_threads = config.flash_prep_threads or default_prep_threads(io_threads)
        self.layout = make_layout(config.flash_layout, geometry, num_blocks)
        self.backend = resolve_backend(config.flash_backend, device)
        # first: the file's size is checked against free space before any bookkeeping is built
        self.cache_file = CacheFile.open(config.flash_path, self.layout, force=config.flash_force)
        try:
            super().__init__(geometry, num_blocks, config.flash_policy, io_threads)
        except BaseException:
            self.cache_file.discard()
            raise
        try:
            io: FileIO
            if self.backend == "kvikio":
                io = KvikioIO(self.cache_file.fd, self.cache_file.path, io_threads=io_threads,
                              want_direct=config.flash_direct_io)
            else:
                io = PosixIO(self.cache_file.fd, self.cache_file.path,
                             want_direct=config.flash_direct_io)
        except BaseException:
            self.cache_file.discard()
            self._pool.shutdown()
            raise
        self.device_share = device_share
        if device_share is not None:
            io = device_share.wrap(io)
        self.faults = FaultInjector() if config.tier_fault_injection else None
        self.io = FaultyIO(io, self.faults) if self.faults is not None else io
        chunk_blocks = max(1, (config.flash_chunk_mib << 20) // self.layout.per_block_file_bytes)
        chunk_blocks = min(chunk_blocks, num_blocks)  # no staging larger than the whole tier
        num_buffers = io_threads + prep_threads
        self.index = PrefixIndex(self.allocator)
        try:
            scan = self._rebuild_index(config) if config.stores_prefixes else None
        except BaseException:
            self.io.close()
            self.cache_file.close()
            self._pool.shutdown()
            raise
        self.mover = ChunkMover(self.layout, self.io, self.cache_file.epoch, chunk_blocks,
                                num_buffers=num_buffers, device=device,
                                first_lsn=scan.next_lsn if scan else 1)
        self.prefix = PrefixStore(
            self.index, geometry, enabled=config.stores_prefixes, scan=scan,
            write_limit=max(1, min(num_blocks // 2,
                                   WRITE_LIMIT_CHUNKS * chunk_blocks * num_buffers)))
        self.prep_threads = prep_threads
        self._cpu_pool = cpu_stage_pool(prep_threads, "hifc-flash-cpu")
        self.pipeline = ChunkPipeline(io_pool=self._pool, cpu_pool=self._cpu_pool)

    def _rebuild_index(self, config: TierConfig) -> ScanResult | None:
        """A reused file: index its prefix records, and resume the log after its newest."""
        if not self.cache_file.reused:
            return None
        fd, _, _ = open_data_fd(self.cache_file.fd, self.cache_file.path,
                                config.flash_direct_io)
        try:
            scan = scan_headers(fd, self.layout, config.flash_io_threads)
        finally:
            os.close(fd)
        self.index.load(scan.records)
        self.allocator.seek(scan.head)
        return scan

    @property
    def epoch(self) -> int:
        return self.cache_file.epoch

    # -- one log for swap and prefix records ---------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a reservation can have now: free ones and unpinned prefix records."""
        return self.index.num_reservable

    def can_reserve(self, n: int) -> bool:
        return self.index.can_reserve(n)

    def reserve(self, n: int) -> list[int]:
        """Reserve ``n`` tier blocks in policy order, overwriting the prefix records the log
        reaches (never one with a read in flight). ValueError if fewer are reservable."""
        self._check_open()
        return self.index.reserve(n)

    def _is_reserved(self, block) -> bool:
        return super()._is_reserved(block) and not self.index.owns(block)

    # -- prefix store ----------------------------------------------------------------------------
    def lookup_prefix(self, hashes, salt: bytes, count: bool = True) -> int:
        """How many leading ``hashes`` (32-byte content hashes of consecutive full blocks) are
        stored under the model ``salt`` (32 bytes) and can be read now. Changes nothing stored
        (the query and its hits are counted in ``stats()``, unless ``count`` is False: the
        engine counts what it admits itself)."""
        return self.prefix.lookup(hashes, salt, count)

    def submit_prefix_write(self, kv_cache: torch.Tensor, pairs, salt: bytes) -> PrefixJob:
        """Store blocks ``kv_cache[:, :, gpu_block]`` under their hashes; pairs are
        ``(gpu_block, block_hash)``. Hashes already stored or being written are skipped, and
        so is what does not fit (free log space, a bound on writes in flight); the job covers
        the rest, appended to the log like swap records. Its completion publishes the blocks
        written (``blocks_ok``); until then the GPU blocks must not change."""
        self._check_open()
        self.prefix.require_enabled()
        check_key("salt", salt)
        self._check_kv(kv_cache)
        pairs = check_write_pairs(pairs)
        self._check_gpu_ids(kv_cache, [g for g, _ in pairs])
        todo = self.prefix.select_writes(pairs, salt, self.index.num_reservable)
        tier_ids = self.index.reserve(len(todo))
        job = PrefixJob(self._new_job_id(), PREFIX_WRITE,
                        tuple((g, b) for (g, _), b in zip(todo, tier_ids)), (0, 0), salt=salt,
                        hashes=tuple(h for _, h in todo), requested=len(pairs),
                        skipped=len(pairs) - len(todo), _done=bytearray(len(todo)))
        if tier_ids:
            self.allocator.mark_written(tier_ids)
        return self._start_prefix(job, kv_cache)

    def submit_prefix_read(self, kv_cache: torch.Tensor, pairs, salt: bytes) -> PrefixJob:
        """Read stored blocks into ``kv_cache``; pairs are ``(block_hash, gpu_block)``, the
        chain from its first block. The job covers the leading hashes stored now. Every record
        is verified (magic, kind, block id, salt, hash, header and payload crcs) before a byte
        of it reaches ``kv_cache``; one that fails is dropped from the index (a miss from then
        on) and fails the job (INTEGRITY, or the I/O error). Either way, once done, the first
        ``job.blocks_ok`` GPU blocks hold the stored KV; recompute from there on."""
        self._check_open()
        self.prefix.require_enabled()
        check_key("salt", salt)
        self._check_kv(kv_cache)
        pairs = check_read_pairs(pairs)
        self._check_gpu_ids(kv_cache, [g for _, g in pairs])
        found = self.prefix.select_reads(pairs, salt)
        job = PrefixJob(self._new_job_id(), PREFIX_READ, tuple((b, g) for b, g, _ in found),
                        (0, 0), salt=salt, hashes=tuple(h for _, _, h in found),
                        requested=len(pairs), _done=bytearray(len(found)))
        return self._start_prefix(job, kv_cache)

    def hold_prefix(self, hashes, salt: bytes) -> list[int]:
        """Keep the records of the leading stored ``hashes`` from being overwritten until
        :meth:`release_prefix` (say the stored blocks of a preempted sequence, so that its
        swap-out can skip them and its swap-in read them back with ``submit_prefix_read``).
        Returns their tier blocks: the handle to release. Held blocks count as reserved."""
        self._check_open()
        self.prefix.require_enabled()
        return self.prefix.hold(hashes, salt)

    def release_prefix(self, tier_blocks) -> None:
        """End holds taken by :meth:`hold_prefix` (ValueError for a block not held)."""
        self.prefix.release(tier_blocks)

    def _start_prefix(self, job: PrefixJob, kv_cache: torch.Tensor) -> PrefixJob:
        self._track(job)
        if not job.pairs:
            return job
        self.prefix.begin(job)
        try:
            job._futures = self._launch_prefix(job, copy_view(kv_cache), ready_event(kv_cache))
            self._watch(job)
        except Exception as exc:  # never raise I/O trouble into the engine
            job.fail(*classify(exc))
        return job

    def _launch_prefix(self, job: PrefixJob, kv_cache, ready) -> list[cf.Future]:
        write = job.op == PREFIX_WRITE
        mover, futures, first = self.mover, [], 0
        for chunk in split_chunks(list(job.pairs), 1 if write else 0, mover.max_chunk_blocks):
            stamp = mover.prefix_stamp(job.salt, job.hashes[first:first + len(chunk)])
            if write:
                task = mover.write(kv_cache, [g for g, _ in chunk], chunk[0][1], stamp, ready,
                                   functools.partial(mark_written, job, first, len(chunk)),
                                   IOPriority.PREFIX_WRITE)  # nobody waits: after swaps
            else:
                task = mover.read(kv_cache, chunk[0][0], [g for _, g in chunk], stamp, ready,
                                  functools.partial(mark_delivered, job, first))
            futures.append(self.pipeline.submit(self.prefix.cancellable(task)))
            first += len(chunk)
        return futures

    def _on_finished(self, job) -> None:
        if isinstance(job, PrefixJob) and job.pairs:
            self.prefix.finish(job)

    def close(self) -> None:
        """Cancel prefix I/O not started yet, wait for the rest, release everything."""
        self.prefix.close()
        super().close()

    def _launch(self, op, kv_cache, pairs, owner, ready, staged) -> list[cf.Future]:
        mover = self.mover
        limit = mover.max_chunk_blocks
        if op == SWAP_OUT:  # each chunk reports its blocks staged once gathered
            tasks, first = [], 0
            for chunk in split_chunks(pairs, 1, limit):
                tasks.append(mover.swap_out(kv_cache, [s for s, _ in chunk], chunk[0][1], owner,
                                            ready, functools.partial(staged, first, len(chunk))))
                first += len(chunk)
        else:
            tasks = [mover.swap_in(kv_cache, chunk[0][0], [d for _, d in chunk], owner, ready)
                     for chunk in split_chunks(pairs, 0, limit)]
        return [self.pipeline.submit(task) for task in tasks]

    def stalled(self) -> AbstractContextManager:
        share = self.device_share
        return share.stalled() if share is not None else nullcontext()

    def _extra_stats(self) -> dict:
        return {"path": self.cache_file.path, "layout": self.layout.name,
                "backend": self.io.name, "direct_io": self.io.direct,
                "io_notes": list(self.io.notes), "epoch": self.epoch,
                "reused_file": self.cache_file.reused,
                "init_seconds": self.cache_file.init_seconds,
                "file_bytes": self.layout.file_bytes,
                "chunk_blocks": self.mover.max_chunk_blocks,
                "prep_threads": self.prep_threads, **self.prefix.stats()}

    def _shutdown(self) -> None:
        self._cpu_pool.shutdown(wait=True)
        self.mover.release()
        self.io.close()
        self.cache_file.close()
