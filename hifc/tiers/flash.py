"""``FlashTier``: KV blocks swapped to a preallocated cache file on an SSD.

Wires together the cache file (superblock, epoch), the layout, an I/O backend (kvikio for GPU
KV caches when available, else POSIX O_DIRECT), optional fault injection and the chunk swapper.
A swap's pairs are cut, in the order given, into chunks of consecutive tier ids (adjacent blocks
coalesced into large I/Os, at most ``chunk_mib`` each); every chunk is one task on the tier's
thread pool, so a job is a batch of chunk tasks whose completion ``poll`` checks.
"""
from __future__ import annotations

import concurrent.futures as cf

import torch

from hifc.tiers.cache_file import CacheFile
from hifc.tiers.faults import FaultInjector, FaultyIO
from hifc.tiers.io_base import FileIO
from hifc.tiers.kvikio_io import KvikioIO, kvikio_available
from hifc.tiers.layout import KVGeometry, make_layout
from hifc.tiers.posix_io import PosixIO
from hifc.tiers.swapper import ChunkSwapper
from hifc.tiers.tier import SWAP_OUT, KVTier

BACKENDS = ("auto", "posix", "kvikio")


def resolve_backend(backend: str, device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown I/O backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend == "auto":
        on_gpu = torch.device(device).type == "cuda"
        return "kvikio" if on_gpu and kvikio_available() else "posix"
    if backend == "kvikio" and not kvikio_available():
        raise ValueError("backend 'kvikio' needs the kvikio package and a CUDA device")
    return backend


def split_chunks(pairs: list[tuple[int, int]], tier_index: int, max_blocks: int):
    """Cut pairs, in order, into runs whose tier ids are consecutive (at most max_blocks)."""
    chunks: list[list[tuple[int, int]]] = []
    for pair in pairs:
        last = chunks[-1] if chunks else None
        if (last is not None and len(last) < max_blocks
                and pair[tier_index] == last[-1][tier_index] + 1):
            last.append(pair)
        else:
            chunks.append([pair])
    return chunks


class FlashTier(KVTier):
    kind = "flash"

    def __init__(self, geometry: KVGeometry, num_blocks: int, path, *, policy: str = "append",
                 layout: str, io_threads: int = 8, backend: str = "auto", device="cpu",
                 chunk_mib: int = 32, direct_io: bool = True, force: bool = False,
                 fault_injection: bool = False):
        self.layout = make_layout(layout, geometry, num_blocks)
        self.backend = resolve_backend(backend, device)
        super().__init__(geometry, num_blocks, policy, io_threads)
        try:
            self.cache_file = CacheFile.open(path, self.layout, force=force)
        except BaseException:
            self._pool.shutdown()
            raise
        try:
            io: FileIO
            if self.backend == "kvikio":
                io = KvikioIO(self.cache_file.fd, self.cache_file.path, io_threads=io_threads,
                              want_direct=direct_io)
            else:
                io = PosixIO(self.cache_file.fd, self.cache_file.path, want_direct=direct_io)
        except BaseException:
            self.cache_file.close()
            self._pool.shutdown()
            raise
        self.faults = FaultInjector() if fault_injection else None
        self.io = FaultyIO(io, self.faults) if self.faults is not None else io
        chunk_blocks = max(1, (chunk_mib << 20) // self.layout.per_block_file_bytes)
        chunk_blocks = min(chunk_blocks, num_blocks)  # no staging larger than the whole tier
        self.swapper = ChunkSwapper(self.layout, self.io, self.cache_file.epoch, chunk_blocks,
                                    num_buffers=io_threads, device=device)

    @property
    def epoch(self) -> int:
        return self.cache_file.epoch

    def _launch(self, op, kv_cache, pairs, owner, ready) -> list[cf.Future]:
        limit = self.swapper.max_chunk_blocks
        futures = []
        if op == SWAP_OUT:
            for chunk in split_chunks(pairs, 1, limit):
                futures.append(self._pool.submit(self.swapper.swap_out, kv_cache,
                                                 [s for s, _ in chunk], chunk[0][1], owner, ready))
        else:
            for chunk in split_chunks(pairs, 0, limit):
                futures.append(self._pool.submit(self.swapper.swap_in, kv_cache, chunk[0][0],
                                                 [d for _, d in chunk], owner, ready))
        return futures

    def _extra_stats(self) -> dict:
        return {"path": self.cache_file.path, "layout": self.layout.name,
                "backend": self.io.name, "direct_io": self.io.direct,
                "io_notes": list(self.io.notes), "epoch": self.epoch,
                "reused_file": self.cache_file.reused,
                "init_seconds": self.cache_file.init_seconds,
                "file_bytes": self.layout.file_bytes,
                "chunk_blocks": self.swapper.max_chunk_blocks}

    def _shutdown(self) -> None:
        self.swapper.release()
        self.io.close()
        self.cache_file.close()
