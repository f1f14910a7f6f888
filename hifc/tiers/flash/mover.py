"""``FlashMover``: one rank's flash I/O (the worker side of :class:`~hifc.tiers.flash.tier.FlashTier`).

Wires together the cache file (superblock, epoch, and which tensor-parallel rank's shard it
holds), an I/O backend (kvikio for GPU KV caches where GPUDirect Storage works, else POSIX
O_DIRECT; see ``resolve_backend``), optional fault injection, the device's arbiter when other
engine replicas share the device (:mod:`hifc.tiers.flash.arbiter`), and the chunk mover. A job's
pairs are cut, in the order given, into chunks of consecutive tier ids (adjacent blocks
coalesced into large I/Os, at most ``flash_chunk_mib`` each); every chunk runs through the
two-stage pipeline of :mod:`hifc.tiers.flash.pipeline` (its I/O on ``flash_io_threads``
threads, its gather, checksums and scatter on ``flash_prep_threads`` others). Staging memory
(:func:`staging_counts`): ``flash_staging_mib`` of host sets, one chunk each (at least one per
I/O thread and per prep thread), and for GPU caches one GPU work buffer per prep thread; where
the backend moves GPU memory itself (kvikio) each set has a GPU buffer of its own, so there are
only as many sets as threads.
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import os
import threading

import torch

from hifc.tiers.config import FLASH_BACKENDS, TierConfig
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.flash.cache_file import CacheFile
from hifc.tiers.flash.chunks import ChunkMover
from hifc.tiers.flash.faults import FaultInjector, FaultyIO
from hifc.tiers.flash.io_base import FileIO, IOPriority
from hifc.tiers.flash.kvikio_io import KvikioIO, gds_available, kvikio_available
from hifc.tiers.flash.layout import Layout, make_layout
from hifc.tiers.flash.pipeline import ChunkPipeline, ChunkTask, cpu_stage_pool
from hifc.tiers.flash.posix_io import PosixIO
from hifc.tiers.flash.staging import host_set_count
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.jobs import JobCancelled
from hifc.tiers.mover import SWAP_OUT, TierMover

PREFIX_WRITE = "prefix_write"
MAX_DEFAULT_PREP_THREADS = 4
RAMP_DIVISOR = 4  # a job's first and last chunk hold at most max_blocks // 4 blocks (>= 1)


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


def default_prep_threads(io_threads: int) -> int:
    """CPU-stage threads when not given: min(io_threads, cores, 4). One thread gathers and
    checksums 4-7 GiB/s (CPU machine), so 4 feed even a fast NVMe; each thread adds one GPU work
    buffer for GPU caches. See docs/RESULTS.md, "Flash tier I/O (issue 3)"."""
    return max(1, min(io_threads, os.cpu_count() or 1, MAX_DEFAULT_PREP_THREADS))


def staging_counts(config: TierConfig, layout: Layout, chunk_blocks: int, num_blocks: int,
                   io_threads: int, prep_threads: int, io_on_gpu: bool) -> tuple[int, int]:
    """(host staging sets, work buffers). A swap-out's chunk keeps its host set until its write
    ends, so the sets bound what a swap-out can stage (and so free) at copy speed:
    ``flash_staging_mib`` of them, at least one per I/O and prep thread (the pipeline's depth),
    at most enough for a swap-out of the whole tier. A work buffer is held only while a prep
    thread gathers or scatters a chunk, so one per prep thread. ``io_on_gpu`` (kvikio): each set
    owns its GPU buffer through the I/O; one set per thread, as many as the pipeline uses."""
    depth = io_threads + prep_threads
    if io_on_gpu:
        return depth, prep_threads
    whole_tier = -(-num_blocks // chunk_blocks) + 2  # the ramp's short first and last chunks
    sets = host_set_count(config.flash_staging_mib << 20, layout.staging_bytes(chunk_blocks),
                          at_least=depth, at_most=whole_tier)
    return sets, prep_threads


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


class FlashMover(TierMover):
    """``shard``: (rank, ranks) of the tensor-parallel shard whose KV this file holds (in its
    superblock: a file of another rank or rank count is reinitialised, never read)."""

    kind = "flash"

    def __init__(self, geometry: KVGeometry, num_blocks: int, config: TierConfig, *,
                 device="cpu", device_share: DeviceShare | None = None,
                 shard: tuple[int, int] = (0, 1)):
        io_threads = config.flash_io_threads
        self.prep_threads = config.flash_prep_threads or default_prep_threads(io_threads)
        self.layout: Layout = make_layout(config.flash_layout, geometry, num_blocks)
        self.backend = resolve_backend(config.flash_backend, device)
        # first: the file's size is checked against free space before anything else is built
        self.cache_file = CacheFile.open(config.flash_path, self.layout, force=config.flash_force,
                                         shard=shard)
        try:
            io = self._open_io(config)
        except BaseException:
            self.cache_file.discard()
            raise
        self.device_share = device_share
        if device_share is not None:
            io = device_share.wrap(io)
        self.faults = FaultInjector() if config.tier_fault_injection else None
        self.io = FaultyIO(io, self.faults) if self.faults is not None else io
        chunk_blocks = max(1, (config.flash_chunk_mib << 20) // self.layout.per_block_file_bytes)
        chunk_blocks = min(chunk_blocks, num_blocks)  # no staging larger than the whole tier
        self.pipeline_depth = io_threads + self.prep_threads  # chunks in the stages at once
        io_on_gpu = torch.device(self.io.staging_device(torch.device(device))).type == "cuda"
        self.num_buffers, num_work = staging_counts(config, self.layout, chunk_blocks,
                                                    num_blocks, io_threads, self.prep_threads,
                                                    io_on_gpu)
        try:  # staging memory, allocated up front
            self.chunks = ChunkMover(self.layout, self.io, self.cache_file.epoch, chunk_blocks,
                                     num_buffers=self.num_buffers, device=device,
                                     num_work_buffers=num_work)
        except BaseException:
            self.io.close()
            self.cache_file.discard()
            raise
        self._io_pool = cf.ThreadPoolExecutor(io_threads, thread_name_prefix="hifc-flash-io")
        self._cpu_pool = cpu_stage_pool(self.prep_threads, "hifc-flash-cpu")
        self.pipeline = ChunkPipeline(io_pool=self._io_pool, cpu_pool=self._cpu_pool)
        self._closing = threading.Event()

    def _open_io(self, config: TierConfig) -> FileIO:
        if self.backend == "kvikio":
            return KvikioIO(self.cache_file.fd, self.cache_file.path,
                            io_threads=config.flash_io_threads,
                            want_direct=config.flash_direct_io)
        return PosixIO(self.cache_file.fd, self.cache_file.path,
                       want_direct=config.flash_direct_io)

    @property
    def epoch(self) -> int:
        return self.cache_file.epoch

    def launch(self, op, kv_cache, pairs, owner, ready, staged=None) -> list[cf.Future]:
        chunks = self.chunks
        limit = chunks.max_chunk_blocks
        if op == SWAP_OUT:  # each chunk reports its blocks staged once gathered
            tasks, first = [], 0
            for chunk in split_chunks(pairs, 1, limit):
                on_staged = (None if staged is None
                             else functools.partial(staged, first, len(chunk)))
                tasks.append(chunks.swap_out(kv_cache, [s for s, _ in chunk], chunk[0][1],
                                             owner, ready, on_staged))
                first += len(chunk)
        else:
            tasks = [chunks.swap_in(kv_cache, chunk[0][0], [d for _, d in chunk], owner, ready)
                     for chunk in split_chunks(pairs, 0, limit)]
        return [self.pipeline.submit(task) for task in tasks]

    def launch_prefix(self, op, kv_cache, pairs, salt, hashes, done, ready) -> list[cf.Future]:
        write = op == PREFIX_WRITE
        chunks, futures, first = self.chunks, [], 0
        for chunk in split_chunks(pairs, 1 if write else 0, chunks.max_chunk_blocks):
            stamp = chunks.prefix_stamp(salt, hashes[first:first + len(chunk)])
            if write:
                task = chunks.write(kv_cache, [g for g, _ in chunk], chunk[0][1], stamp, ready,
                                    functools.partial(_mark_written, done, first, len(chunk)),
                                    IOPriority.PREFIX_WRITE)  # nobody waits: after swaps
            else:
                task = chunks.read(kv_cache, chunk[0][0], [g for _, g in chunk], stamp, ready,
                                   functools.partial(_mark_delivered, done, first))
            futures.append(self.pipeline.submit(self._cancellable(task)))
            first += len(chunk)
        return futures

    def _cancellable(self, task: ChunkTask) -> ChunkTask:
        """``task``, failing with JobCancelled instead of starting once the mover closes."""
        (kind, first_stage), *rest = task.stages
        closing = self._closing

        def guarded(*buffers) -> None:  # the set (and a WORK stage's work buffer)
            if closing.is_set():
                raise JobCancelled("the flash tier closed before this prefix I/O started")
            first_stage(*buffers)

        return ChunkTask(task.pool, ((kind, guarded), *rest), task.nbytes, task.work_pool)

    def cancel_queued(self) -> None:
        """Prefix I/O not started yet is cancelled (swaps always run)."""
        self._closing.set()

    def close(self) -> None:
        self._io_pool.shutdown(wait=True)
        self._cpu_pool.shutdown(wait=True)
        self.chunks.release()
        self.io.close()
        self.cache_file.close()

    def stats(self) -> dict:
        return {"path": self.cache_file.path, "layout": self.layout.name,
                "backend": self.io.name, "direct_io": self.io.direct,
                "io_notes": list(self.io.notes), "epoch": self.epoch,
                "reused_file": self.cache_file.reused,
                "init_seconds": self.cache_file.init_seconds,
                "file_bytes": self.layout.file_bytes,
                "chunk_blocks": self.chunks.max_chunk_blocks,
                "prep_threads": self.prep_threads, **self.chunks.staging_memory()}


def _mark_written(done: bytearray, first: int, count: int) -> None:
    """A chunk of a prefix write (pairs ``first...``) is on the file (a worker thread)."""
    done[first:first + count] = b"\x01" * count


def _mark_delivered(done: bytearray, first: int, i: int) -> None:
    """Block ``i`` of a prefix-read chunk starting at pair ``first`` reached the KV cache."""
    done[first + i] = 1
