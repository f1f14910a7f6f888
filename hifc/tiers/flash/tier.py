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
"""
from __future__ import annotations

import concurrent.futures as cf
import os
from contextlib import AbstractContextManager, nullcontext

import torch

from hifc.tiers.config import FLASH_BACKENDS, TierConfig
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.flash.cache_file import CacheFile
from hifc.tiers.flash.chunks import ChunkMover
from hifc.tiers.flash.faults import FaultInjector, FaultyIO
from hifc.tiers.flash.io_base import FileIO
from hifc.tiers.flash.kvikio_io import KvikioIO, gds_available, kvikio_available
from hifc.tiers.flash.layout import make_layout
from hifc.tiers.flash.pipeline import ChunkPipeline, cpu_stage_pool
from hifc.tiers.flash.posix_io import PosixIO
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.tier import SWAP_OUT, KVTier

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
        super().__init__(geometry, num_blocks, config.flash_policy, io_threads)
        try:
            self.cache_file = CacheFile.open(config.flash_path, self.layout,
                                             force=config.flash_force)
        except BaseException:
            self._pool.shutdown()
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
            self.cache_file.close()
            self._pool.shutdown()
            raise
        self.device_share = device_share
        if device_share is not None:
            io = device_share.wrap(io)
        self.faults = FaultInjector() if config.tier_fault_injection else None
        self.io = FaultyIO(io, self.faults) if self.faults is not None else io
        chunk_blocks = max(1, (config.flash_chunk_mib << 20) // self.layout.per_block_file_bytes)
        chunk_blocks = min(chunk_blocks, num_blocks)  # no staging larger than the whole tier
        self.mover = ChunkMover(self.layout, self.io, self.cache_file.epoch, chunk_blocks,
                                    num_buffers=io_threads + prep_threads, device=device)
        self.prep_threads = prep_threads
        self._cpu_pool = cpu_stage_pool(prep_threads, "hifc-flash-cpu")
        self.pipeline = ChunkPipeline(io_pool=self._pool, cpu_pool=self._cpu_pool)

    @property
    def epoch(self) -> int:
        return self.cache_file.epoch

    def _launch(self, op, kv_cache, pairs, owner, ready) -> list[cf.Future]:
        mover = self.mover
        limit = mover.max_chunk_blocks
        if op == SWAP_OUT:
            tasks = [mover.swap_out(kv_cache, [s for s, _ in chunk], chunk[0][1], owner, ready)
                     for chunk in split_chunks(pairs, 1, limit)]
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
                "prep_threads": self.prep_threads}

    def _shutdown(self) -> None:
        self._cpu_pool.shutdown(wait=True)
        self.mover.release()
        self.io.close()
        self.cache_file.close()
